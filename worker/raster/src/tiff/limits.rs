//! Explicit bounds on everything a file can make the reader allocate.

/// Limits applied while opening a file and reading windows.
///
/// Every allocation whose size comes from the file is checked against one of
/// these before it is made.
///
/// Peak memory of one [`super::TiffFile::read_window`] with the defaults:
/// compressed input ≤ `max_fetch_bytes` (256 MiB), one data block in flight
/// (decoded buffer plus, for JPEG/WebP, the codec's own output: ≤ 2 ×
/// `max_tile_bytes` = 128 MiB), one mask block (≤ 64 MiB), a ZSTD window
/// (≤ max(block, 8 MiB)) and the output, 9 B × `max_window_samples`
/// (f64 values + validity, 288 MiB): about 750 MiB in the worst case. A
/// 512 × 512 chip of a 4-band COG with 512² tiles needs a few MiB.
///
/// An open file keeps its block tables (16 B × at most `max_blocks` over all
/// IFDs = 16 MiB) and the 64 KiB metadata prefix; while opening, tag
/// payloads read are bounded by `max_tag_bytes` (32 MiB).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TiffLimits {
    /// Most IFDs followed in the IFD chain (main image, overviews, masks).
    pub max_ifds: usize,
    /// Most pixels an image may claim (width × height), and most pixels of one decoded block.
    pub max_pixels: u64,
    /// Most bytes of one tile/strip, compressed or decoded.
    pub max_tile_bytes: u64,
    /// Most tiles/strips (all planes) in one image.
    pub max_blocks: u64,
    /// Most bytes of tag payload read for the whole file (offset tables included).
    pub max_tag_bytes: u64,
    /// Most entries in one IFD.
    pub max_ifd_entries: u64,
    /// Most samples per pixel.
    pub max_bands: u64,
    /// Most output samples (width × height × bands) of one window.
    pub max_window_samples: u64,
    /// Most compressed bytes fetched for one window.
    pub max_fetch_bytes: u64,
    /// Byte ranges separated by at most this gap are merged into one request.
    pub coalesce_gap: u64,
    /// A merged request never grows beyond this many bytes.
    pub max_request_bytes: u64,
    /// Bytes read at open to serve the header and (usually all) IFDs in one request.
    pub prefetch_bytes: u64,
}

impl Default for TiffLimits {
    fn default() -> Self {
        TiffLimits {
            max_ifds: 64,
            // 2^32 pixels: ~65k × 65k, larger than any single scene we embed.
            max_pixels: 1 << 32,
            max_tile_bytes: 64 << 20,
            max_blocks: 1 << 20,
            max_tag_bytes: 32 << 20,
            max_ifd_entries: 4096,
            max_bands: 4096,
            max_window_samples: 1 << 25,
            max_fetch_bytes: 256 << 20,
            coalesce_gap: 64 << 10,
            max_request_bytes: 16 << 20,
            prefetch_bytes: 64 << 10,
        }
    }
}
