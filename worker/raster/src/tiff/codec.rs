//! Block decompression into buffers of exactly the size the layout requires.
//!
//! Each decoder writes into a preallocated buffer and stops when it is full;
//! any further output is an error, so a decompression bomb costs at most the
//! expected block size plus a few bytes.

use std::io::Read;

use super::layout::compression_name;
use super::TiffError;

/// ruzstd reserves the frame's declared window up front, so the window is
/// capped: the block size, or 8 MiB (zstd's window for levels up to 19 at
/// these block sizes), whichever is larger.
const ZSTD_MIN_WINDOW: u64 = 8 << 20;

/// What a codec needs to know about the block it decodes.
pub(crate) struct BlockCtx<'a> {
    pub(crate) compression: u16,
    pub(crate) block: usize,
    pub(crate) width: u32,
    /// Rows of data expected (short for the last strip).
    pub(crate) rows: u32,
    pub(crate) samples: usize,
    pub(crate) photometric: u16,
    pub(crate) jpeg_tables: Option<&'a [u8]>,
    /// Decoded size in bytes.
    pub(crate) expected: usize,
}

fn err<E: std::error::Error + Send + Sync + 'static>(
    codec: &'static str,
    block: usize,
    e: E,
) -> TiffError {
    TiffError::Decode {
        codec,
        block,
        source: Box::new(e),
    }
}

fn size_err(ctx: &BlockCtx, codec: &'static str, detail: String) -> TiffError {
    TiffError::BlockSize {
        codec,
        block: ctx.block,
        expected: ctx.expected,
        detail,
    }
}

/// Decompresses one block.
pub(crate) fn decode(ctx: &BlockCtx, input: &[u8]) -> Result<Vec<u8>, TiffError> {
    match ctx.compression {
        1 => {
            // Writers may pad uncompressed blocks; only a short one is an error.
            if input.len() < ctx.expected {
                return Err(size_err(
                    ctx,
                    "none",
                    format!("block holds only {} bytes", input.len()),
                ));
            }
            Ok(input[..ctx.expected].to_vec())
        }
        5 => lzw(ctx, input),
        8 | 32946 => inflate(ctx, input),
        50000 => {
            let dec = ruzstd::decoding::StreamingDecoder::new_with_max_window_size(
                input,
                (ctx.expected as u64).max(ZSTD_MIN_WINDOW),
            )
            .map_err(|e| err("ZSTD", ctx.block, e))?;
            read_exact(ctx, "ZSTD", dec)
        }
        32773 => packbits(ctx, input),
        7 => jpeg(ctx, input),
        50001 => webp(ctx, input),
        c => Err(TiffError::UnsupportedCompression {
            code: c,
            name: compression_name(c),
        }),
    }
}

/// Inflates a zlib block straight into its buffer: no reader, no copy.
fn inflate(ctx: &BlockCtx, input: &[u8]) -> Result<Vec<u8>, TiffError> {
    use flate2::{Decompress, FlushDecompress, Status};
    let mut out = vec![0u8; ctx.expected];
    let mut d = Decompress::new(true);
    let res = d.decompress(input, &mut out, FlushDecompress::Finish);
    let n = d.total_out() as usize;
    let short = |n: usize| size_err(ctx, "Deflate", format!("stream ended after {n} bytes"));
    match res {
        Ok(Status::StreamEnd) if n == out.len() => Ok(out),
        Ok(Status::StreamEnd) => Err(short(n)),
        Ok(_) if n < out.len() => Err(short(n)),
        Ok(_) => {
            // The buffer is full before the stream's end: more pixels follow
            // unless all that is left is the trailer.
            let rest = &input[(d.total_in() as usize).min(input.len())..];
            let mut extra = [0u8; 1];
            match d.decompress(rest, &mut extra, FlushDecompress::Finish) {
                Ok(_) if d.total_out() as usize > n => {
                    Err(size_err(ctx, "Deflate", "stream holds more data".into()))
                }
                _ => Ok(out),
            }
        }
        // The block is complete; a damaged trailer (checksum) does not change its pixels.
        Err(_) if n == out.len() => Ok(out),
        Err(e) => Err(err("Deflate", ctx.block, e)),
    }
}

fn read_exact(ctx: &BlockCtx, codec: &'static str, mut r: impl Read) -> Result<Vec<u8>, TiffError> {
    let mut out = vec![0u8; ctx.expected];
    let mut n = 0;
    while n < out.len() {
        match r.read(&mut out[n..]) {
            Ok(0) => {
                return Err(size_err(
                    ctx,
                    codec,
                    format!("stream ended after {n} bytes"),
                ))
            }
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(err(codec, ctx.block, e)),
        }
    }
    let mut extra = [0u8; 1];
    match r.read(&mut extra) {
        Ok(0) => Ok(out),
        Ok(_) => Err(size_err(ctx, codec, "stream holds more data".into())),
        // The block is complete; a damaged trailer (checksum) does not change its pixels.
        Err(_) => Ok(out),
    }
}

fn lzw(ctx: &BlockCtx, input: &[u8]) -> Result<Vec<u8>, TiffError> {
    use weezl::{decode::Configuration, BitOrder, LzwStatus};
    let mut out = vec![0u8; ctx.expected];
    // Yielding when `out` is full stops the decoder there: what follows is
    // probed one byte at a time below, never decoded into memory.
    let mut dec = Configuration::with_tiff_size_switch(BitOrder::Msb, 8)
        .with_yield_on_full_buffer(true)
        .build();
    let (mut i, mut o) = (0usize, 0usize);
    // One call may stop early (a clear code, the decoder's own buffer), so
    // call until the block is full or the stream stops making progress.
    while o < out.len() {
        let r = dec.decode_bytes(&input[i..], &mut out[o..]);
        i += r.consumed_in;
        o += r.consumed_out;
        match r.status {
            Ok(LzwStatus::Ok) if r.consumed_in + r.consumed_out > 0 => {}
            Ok(_) => break,
            Err(e) => return Err(err("LZW", ctx.block, e)),
        }
    }
    // GDAL (libtiff) accepts a block missing its end code as long as it is
    // complete, so only a short one fails.
    if o < out.len() {
        return Err(size_err(
            ctx,
            "LZW",
            format!("stream ended after {o} bytes"),
        ));
    }
    let mut extra = [0u8; 1];
    while !dec.has_ended() {
        let r = dec.decode_bytes(&input[i..], &mut extra);
        i += r.consumed_in;
        if r.consumed_out > 0 {
            return Err(size_err(ctx, "LZW", "stream holds more data".into()));
        }
        match r.status {
            Ok(LzwStatus::Ok) if r.consumed_in > 0 => {}
            Ok(_) => break,
            Err(e) => return Err(err("LZW", ctx.block, e)),
        }
    }
    Ok(out)
}

fn packbits(ctx: &BlockCtx, input: &[u8]) -> Result<Vec<u8>, TiffError> {
    let mut out = Vec::with_capacity(ctx.expected);
    let mut i = 0;
    while out.len() < ctx.expected && i < input.len() {
        let n = input[i] as i8;
        i += 1;
        if n >= 0 {
            let len = n as usize + 1;
            let lit = input
                .get(i..i + len)
                .ok_or_else(|| size_err(ctx, "PackBits", "literal run past end of data".into()))?;
            if out.len() + len > ctx.expected {
                return Err(size_err(ctx, "PackBits", "run overflows block".into()));
            }
            out.extend_from_slice(lit);
            i += len;
        } else if n != -128 {
            let len = (1 - n as isize) as usize;
            let b = *input
                .get(i)
                .ok_or_else(|| size_err(ctx, "PackBits", "repeat run past end of data".into()))?;
            if out.len() + len > ctx.expected {
                return Err(size_err(ctx, "PackBits", "run overflows block".into()));
            }
            out.resize(out.len() + len, b);
            i += 1;
        }
    }
    if out.len() < ctx.expected {
        return Err(size_err(
            ctx,
            "PackBits",
            format!("data ended after {} bytes", out.len()),
        ));
    }
    Ok(out)
}

/// Copies decoded rows into a block-sized buffer after checking the codec's geometry.
fn fit(
    ctx: &BlockCtx,
    codec: &'static str,
    w: usize,
    h: usize,
    ch: usize,
    pix: &[u8],
) -> Result<Vec<u8>, TiffError> {
    if w != ctx.width as usize || h < ctx.rows as usize || ch != ctx.samples {
        return Err(size_err(
            ctx,
            codec,
            format!(
                "codec image is {w}x{h}x{ch}, block is {}x{}x{}",
                ctx.width, ctx.rows, ctx.samples
            ),
        ));
    }
    let n = ctx.expected.min(pix.len());
    if n < ctx.expected {
        return Err(size_err(
            ctx,
            codec,
            format!("codec produced {} bytes", pix.len()),
        ));
    }
    Ok(pix[..n].to_vec())
}

/// JPEG and WebP decode to one byte per sample; a block of any other depth (a
/// 1-bit mask, 16-bit data) would decode to a different size than the block
/// holds, so it is refused before the decoder allocates from its own header.
fn require_8bit(ctx: &BlockCtx, codec: &str) -> Result<(), TiffError> {
    if ctx.expected != ctx.width as usize * ctx.rows as usize * ctx.samples {
        return Err(TiffError::Unsupported(format!(
            "{codec} blocks need 8-bit samples"
        )));
    }
    Ok(())
}

fn jpeg(ctx: &BlockCtx, input: &[u8]) -> Result<Vec<u8>, TiffError> {
    use crate::jpeg::{self, ColorTransform, Error as JpegError, Limits};
    require_8bit(ctx, "JPEG")?;
    // As libtiff with JPEGCOLORMODE_RGB, which GDAL sets: YCbCr is converted to
    // RGB, anything else (RGB, grey) is passed through as stored.
    let transform = if ctx.photometric == 6 {
        ColorTransform::YCbCrToRgb
    } else {
        ColorTransform::None
    };
    let limits = Limits {
        max_width: ctx.width,
        max_height: ctx.rows.max(1) * 2 + 16,
        // Planes, coefficients (progressive) and output: a few times the block.
        max_alloc: (ctx.expected as u64).saturating_mul(8).max(1 << 20),
    };
    let img = jpeg::decode(ctx.jpeg_tables, input, transform, &limits).map_err(|e| match e {
        JpegError::Unsupported(what) => TiffError::Unsupported(format!("JPEG: {what}")),
        e => err("JPEG", ctx.block, e),
    })?;
    fit(
        ctx,
        "JPEG",
        img.width as usize,
        img.height as usize,
        usize::from(img.components),
        &img.data,
    )
}

fn webp(ctx: &BlockCtx, input: &[u8]) -> Result<Vec<u8>, TiffError> {
    require_8bit(ctx, "WebP")?;
    let mut dec = image_webp::WebPDecoder::new(std::io::Cursor::new(input))
        .map_err(|e| err("WebP", ctx.block, e))?;
    let (w, h) = dec.dimensions();
    let ch = if dec.has_alpha() { 4 } else { 3 };
    if w != ctx.width || h < ctx.rows || h as u64 > ctx.rows as u64 + 16 || ch != ctx.samples {
        return Err(size_err(
            ctx,
            "WebP",
            format!("WebP image is {w}x{h} with {ch} channels"),
        ));
    }
    dec.set_memory_limit(ctx.expected.saturating_mul(2).max(1 << 20));
    let mut pix = vec![0u8; w as usize * h as usize * ch];
    dec.read_image(&mut pix)
        .map_err(|e| err("WebP", ctx.block, e))?;
    fit(ctx, "WebP", w as usize, h as usize, ch, &pix)
}

#[cfg(test)]
mod lzw_tests {
    use super::*;

    fn ctx(expected: usize) -> BlockCtx<'static> {
        BlockCtx {
            compression: 5,
            block: 3,
            width: 1,
            rows: 1,
            samples: 1,
            photometric: 1,
            jpeg_tables: None,
            expected,
        }
    }

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

    fn detail(e: TiffError) -> String {
        match e {
            TiffError::BlockSize { detail, .. } => detail,
            e => panic!("expected a block size error, got {e}"),
        }
    }

    #[test]
    fn round_trips_and_sizes_are_exact() {
        let mut st = 0x9E3779B97F4A7C15u64;
        for case in 0..200 {
            let n = 1 + (xorshift(&mut st) % 70_000) as usize;
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
            assert!(decode(&ctx(n), &enc).unwrap() == data, "case {case}");
            // Without the end code the complete block still decodes, as in GDAL.
            let mut no_end = weezl::encode::Encoder::with_tiff_size_switch(weezl::BitOrder::Msb, 8);
            let mut partial = vec![0u8; enc.len() + 16];
            let r = no_end.encode_bytes(&data, &mut partial);
            assert_eq!(r.consumed_in, n, "case {case}");
            let cut = &partial[..r.consumed_out];
            if let Ok(got) = decode(&ctx(n), cut) {
                assert!(got == data, "case {case}: stream without end code");
            }
            let short = detail(decode(&ctx(n - 1), &enc).unwrap_err());
            assert_eq!(short, "stream holds more data", "case {case}");
            let long = detail(decode(&ctx(n + 1), &enc).unwrap_err());
            assert_eq!(long, format!("stream ended after {n} bytes"), "case {case}");
        }
    }

    #[test]
    fn garbage_is_an_error_or_short_never_a_panic() {
        let mut st = 7u64;
        for _ in 0..2000 {
            let n = (xorshift(&mut st) % 600) as usize;
            let input: Vec<u8> = (0..n).map(|_| xorshift(&mut st) as u8).collect();
            let _ = decode(&ctx((xorshift(&mut st) % 5000) as usize), &input);
        }
        // 9-bit code 300 right after the start names nothing.
        let bad = [(300u16 >> 1) as u8, ((300u16 & 1) << 7) as u8];
        let e = decode(&ctx(10), &bad).unwrap_err();
        assert!(
            matches!(
                e,
                TiffError::Decode {
                    codec: "LZW",
                    block: 3,
                    ..
                }
            ),
            "{e}"
        );
    }
}
