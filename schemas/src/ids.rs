//! Deterministic identities: chips, tasks, jobs and fingerprints.
//!
//! Every identity is SHA-256 over length-prefixed fields, so that no two
//! different field lists can hash the same bytes ("ab","c" versus "a","bc").
//! Identities never depend on an embedding or on the time a job ran: a task run
//! twice names the same file, and a chip embedded twice has the same id.

use sha2::{Digest, Sha256};

/// Builds an identity from a domain tag and a list of fields.
#[derive(Clone)]
pub struct IdHasher(Sha256);

impl IdHasher {
    /// Starts a hash in the given domain, so a chip id can never equal a task id.
    pub fn new(domain: &str) -> Self {
        let mut h = IdHasher(Sha256::new());
        h.bytes(domain.as_bytes());
        h
    }

    /// Adds a field of raw bytes.
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.update((b.len() as u64).to_le_bytes());
        self.0.update(b);
        self
    }

    /// Adds a string field.
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.bytes(s.as_bytes())
    }

    /// Adds an optional string field; `None` and `Some("")` differ.
    pub fn opt_str(&mut self, s: Option<&str>) -> &mut Self {
        match s {
            None => self.bytes(&[0]),
            Some(s) => self.bytes(&[1]).str(s),
        }
    }

    /// Adds an integer field.
    pub fn i64(&mut self, v: i64) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }

    /// The full digest as 64 hex chars.
    pub fn hex256(&self) -> String {
        hex::encode(self.0.clone().finalize())
    }

    /// The first 128 bits as 32 hex chars.
    pub fn hex128(&self) -> String {
        hex::encode(&self.0.clone().finalize()[..16])
    }
}

/// A chip's window in source pixels, padding included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Column of the top-left pixel.
    pub x: i32,
    /// Row of the top-left pixel.
    pub y: i32,
    /// Width in source pixels.
    pub width: i32,
    /// Height in source pixels.
    pub height: i32,
}

/// The `chip_id` column: first 128 bits of SHA-256 over
/// (source_uri, source_version, x, y, width, height, tiling fingerprint).
pub fn chip_id(
    source_uri: &str,
    source_version: Option<&str>,
    w: Window,
    tiling_fingerprint: &str,
) -> String {
    IdHasher::new("rsembed.chip.v1")
        .str(source_uri)
        .opt_str(source_version)
        .i64(w.x.into())
        .i64(w.y.into())
        .i64(w.width.into())
        .i64(w.height.into())
        .str(tiling_fingerprint)
        .hex128()
}

/// The `chip_id` of a composite's row (`--composite median`): first 128
/// bits of SHA-256 over (cell, window start, window end, composite, tiling
/// fingerprint), in a domain of its own, so it never equals a scene chip's.
pub fn composite_chip_id(
    cell: &str,
    window_start: i64,
    window_end: i64,
    composite: &str,
    tiling_fingerprint: &str,
) -> String {
    IdHasher::new("rsembed.chip.composite.v1")
        .str(cell)
        .i64(window_start)
        .i64(window_end)
        .str(composite)
        .str(tiling_fingerprint)
        .hex128()
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Window = Window {
        x: 0,
        y: 0,
        width: 64,
        height: 64,
    };

    #[test]
    fn chip_id_is_32_hex_and_stable() {
        let a = chip_id("file:///a.png", Some("1-2"), W, "t");
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(a, chip_id("file:///a.png", Some("1-2"), W, "t"));
    }

    #[test]
    fn a_composite_chip_id_depends_on_every_field_and_is_no_scene_chips() {
        let cell = "EPSG:32633/10/64/938/-7814";
        let base = composite_chip_id(cell, 1, 2, "median", "t");
        assert_eq!(base.len(), 32);
        assert_eq!(base, composite_chip_id(cell, 1, 2, "median", "t"));
        for other in [
            composite_chip_id("EPSG:32633/10/64/939/-7814", 1, 2, "median", "t"),
            composite_chip_id(cell, 0, 2, "median", "t"),
            composite_chip_id(cell, 1, 3, "median", "t"),
            composite_chip_id(cell, 1, 2, "mean", "t"),
            composite_chip_id(cell, 1, 2, "median", "u"),
        ] {
            assert_ne!(base, other);
        }
        let uri = format!("rsembed:median/{cell}/x");
        assert_ne!(base, chip_id(&uri, None, W, "t"), "its own domain");
    }

    #[test]
    fn chip_id_depends_on_every_field() {
        let base = chip_id("file:///a.png", Some("1-2"), W, "t");
        assert_ne!(base, chip_id("file:///b.png", Some("1-2"), W, "t"));
        assert_ne!(base, chip_id("file:///a.png", None, W, "t"));
        assert_ne!(base, chip_id("file:///a.png", Some(""), W, "t"));
        assert_ne!(
            base,
            chip_id("file:///a.png", Some("1-2"), Window { x: 1, ..W }, "t")
        );
        assert_ne!(base, chip_id("file:///a.png", Some("1-2"), W, "u"));
    }

    #[test]
    fn length_prefix_separates_fields() {
        let a = IdHasher::new("d").str("ab").str("c").hex256();
        let b = IdHasher::new("d").str("a").str("bc").hex256();
        assert_ne!(a, b);
    }
}
