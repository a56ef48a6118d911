//! TIFF LZW (MSB-first codes, 9 to 12 bits, early change), decoded by
//! back-references into the output.
//!
//! Every code's string is already somewhere in the output (it is an earlier
//! string plus the first byte of the one after it), so the table holds only
//! (offset, length) pairs and emitting a code is one copy. A generic LZW
//! decoder that rebuilds strings through a prefix table was a sixth of the
//! time of reading an LZW scene.

const CLEAR: u16 = 256;
const END: u16 = 257;
const FIRST: u16 = 258;
const MAX_WIDTH: u32 = 12;
const TABLE: usize = 1 << MAX_WIDTH;

/// How a stream ended, once `out` was filled as far as it goes.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Decoded {
    /// Bytes written to `out`.
    pub written: usize,
    /// The stream held more data than `out` has room for.
    pub overflow: bool,
}

/// Decodes `input` into `out`; stops at the end code, at the end of the
/// input, or when `out` is full. A code that names no string is an error.
pub(crate) fn decode(input: &[u8], out: &mut [u8]) -> Result<Decoded, String> {
    let mut table = vec![(0u32, 0u32); TABLE];
    let (mut acc, mut have) = (0u64, 0u32);
    let mut pos = 0usize;
    let mut width = 9u32;
    let mut next = FIRST;
    // (offset, length) of the previous code's string; `None` right after a clear.
    let mut prev: Option<(usize, usize)> = None;
    let mut o = 0usize;
    loop {
        while have < width {
            match input.get(pos) {
                Some(&b) => {
                    acc = (acc << 8) | u64::from(b);
                    have += 8;
                    pos += 1;
                }
                None => {
                    return Ok(Decoded {
                        written: o,
                        overflow: false,
                    })
                }
            }
        }
        have -= width;
        let code = ((acc >> have) & ((1 << width) - 1)) as u16;
        if code == CLEAR {
            width = 9;
            next = FIRST;
            prev = None;
            continue;
        }
        if code == END {
            return Ok(Decoded {
                written: o,
                overflow: false,
            });
        }
        if o == out.len() {
            return Ok(Decoded {
                written: o,
                overflow: true,
            });
        }
        let len = if code < CLEAR {
            out[o] = code as u8;
            1
        } else if code < next && code >= FIRST {
            let (s, l) = table[code as usize];
            let (s, l) = (s as usize, l as usize);
            let n = l.min(out.len() - o);
            out.copy_within(s..s + n, o);
            if n < l {
                return Ok(Decoded {
                    written: out.len(),
                    overflow: true,
                });
            }
            l
        } else if code == next {
            // The string being defined: the previous one plus its own first byte.
            let Some((ps, pl)) = prev else {
                return Err(format!("code {code} before any string"));
            };
            let n = pl.min(out.len() - o);
            out.copy_within(ps..ps + n, o);
            if n < pl || o + pl == out.len() {
                return Ok(Decoded {
                    written: o + n,
                    overflow: true,
                });
            }
            out[o + pl] = out[ps];
            pl + 1
        } else {
            return Err(format!("code {code} is not yet defined (next is {next})"));
        };
        if let Some((ps, pl)) = prev {
            if (next as usize) < TABLE {
                // Previous string plus the first byte of this one, which
                // follows it directly in the output.
                table[next as usize] = (ps as u32, pl as u32 + 1);
                next += 1;
                if u32::from(next) + 1 >= 1 << width && width < MAX_WIDTH {
                    width += 1;
                }
            }
        }
        prev = Some((o, len));
        o += len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(data: &[u8]) -> Vec<u8> {
        weezl::encode::Encoder::with_tiff_size_switch(weezl::BitOrder::Msb, 8)
            .encode(data)
            .unwrap()
    }

    fn xorshift(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    #[test]
    fn round_trips_weezl_streams() {
        let mut st = 0x9E3779B97F4A7C15u64;
        for case in 0..200 {
            let n = (xorshift(&mut st) % 70_000) as usize;
            // Low-entropy runs and noise, so codes reach 12 bits and the table fills.
            let alphabet = 1 + (case % 7) * 40;
            let data: Vec<u8> = (0..n)
                .map(|i| match case % 3 {
                    0 => (xorshift(&mut st) % alphabet as u64) as u8,
                    1 => (i / (1 + case % 13)) as u8,
                    _ => (i % 251) as u8 ^ (xorshift(&mut st) % 2) as u8,
                })
                .collect();
            let enc = encode(&data);
            let mut out = vec![0u8; n];
            let d = decode(&enc, &mut out).unwrap();
            assert_eq!(d.written, n, "case {case}");
            assert!(!d.overflow, "case {case}");
            assert!(out == data, "case {case}: bytes differ");
            // One byte short: the rest of the stream is overflow.
            if n > 0 {
                let mut short = vec![0u8; n - 1];
                let d = decode(&enc, &mut short).unwrap();
                assert_eq!((d.written, d.overflow), (n - 1, true), "case {case}");
                assert!(short[..] == data[..n - 1], "case {case}");
            }
        }
    }

    #[test]
    fn garbage_is_an_error_or_short_never_a_panic() {
        let mut st = 7u64;
        for _ in 0..2000 {
            let n = (xorshift(&mut st) % 600) as usize;
            let input: Vec<u8> = (0..n).map(|_| xorshift(&mut st) as u8).collect();
            let mut out = vec![0u8; (xorshift(&mut st) % 5000) as usize];
            let _ = decode(&input, &mut out);
        }
        // 9-bit code 300 right after the start names nothing.
        let bad = [(300u16 >> 1) as u8, ((300u16 & 1) << 7) as u8];
        assert!(decode(&bad, &mut [0u8; 10]).is_err());
    }
}
