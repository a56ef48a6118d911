//! Explicit bounds on everything a file can make the reader allocate.

/// Limits applied while opening a file and reading windows.
///
/// Every allocation whose size comes from the file is checked against one of
/// these before it is made. With the defaults, the peak memory of one
/// [`super::TiffFile::read_window`] is bounded by
/// `max_fetch_bytes` (compressed input, 256 MiB)
/// + `2 * max_tile_bytes` (one decoded data block and one decoded mask block, 2 × 64 MiB)
/// + `9 * max_window_samples` (f64 values + validity, 9 × 2^25 B = 288 MiB),
///
/// i.e. about 672 MiB, and the metadata kept by an open file by
/// `max_tag_bytes` (32 MiB) plus `16 * max_blocks * max_ifds`-free bookkeeping
/// (offset tables are counted in `max_tag_bytes`).
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
