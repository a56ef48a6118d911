//! Byte counts as flags take them and summaries print them.

/// Parses a byte count: a plain number of bytes, or a number with a suffix,
/// binary (`KiB`, `MiB`, `GiB`, `TiB`, and the bare `K`, `M`, `G`, `T`) or
/// decimal (`KB`, `MB`, `GB`, `TB`), case-insensitive: `8GiB`, `512MiB`, `1.5G`.
pub fn parse_byte_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = (&t[..split], t[split..].trim());
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => {
            return Err(format!(
                "`{s}`: unknown unit `{unit}` (use bytes, KiB, MiB, GiB, TiB, KB, MB, GB or TB)"
            ))
        }
    };
    let bad = || format!("`{s}` is not a byte count such as 8GiB, 512MiB or 1073741824");
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(mult).ok_or_else(bad);
    }
    let f: f64 = num.parse().map_err(|_| bad())?;
    let bytes = f * mult as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes >= u64::MAX as f64 {
        return Err(bad());
    }
    Ok(bytes as u64)
}

/// `b` bytes in binary units, one decimal (`1.5 KiB`), for summaries.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_take_binary_and_decimal_suffixes() {
        assert_eq!(parse_byte_size("1073741824"), Ok(1 << 30));
        assert_eq!(parse_byte_size("8GiB"), Ok(8 << 30));
        assert_eq!(parse_byte_size("8gib"), Ok(8 << 30));
        assert_eq!(parse_byte_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_byte_size("512M"), Ok(512 << 20));
        assert_eq!(parse_byte_size("2GB"), Ok(2_000_000_000));
        assert_eq!(parse_byte_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_byte_size(" 4 KiB "), Ok(4096));
        assert!(parse_byte_size("8 parsecs").is_err());
        assert!(parse_byte_size("GiB").is_err());
        assert!(parse_byte_size("-1").is_err());
        assert!(parse_byte_size("99999999999TiB").is_err());
    }

    #[test]
    fn human_bytes_units() {
        assert_eq!(human_bytes(12), "12 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 << 20), "3.0 MiB");
    }
}
