//! The TIFF LZW decoder the reader used until weezl 0.2 matched it (issue 14;
//! docs/decisions.md), kept as `benches/lzw.rs`'s baseline. MSB-first codes,
//! 9 to 12 bits, early change, decoded by back-references into the output.
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
