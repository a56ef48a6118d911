//! Test helpers: an in-memory [`RangeRead`] and fixture loading.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;

use super::{RangeRead, SampleType, TiffError, TiffFile, TiffLimits};

/// In-memory object that counts requests and bytes served.
pub(crate) struct MemReader {
    pub(crate) data: Bytes,
    pub(crate) requests: AtomicU64,
    pub(crate) bytes: AtomicU64,
}

impl MemReader {
    pub(crate) fn new(data: Vec<u8>) -> Arc<Self> {
        Arc::new(MemReader {
            data: data.into(),
            requests: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        })
    }
}

impl RangeRead for MemReader {
    fn size(&self) -> u64 {
        self.data.len() as u64
    }
    fn read_range(
        &self,
        start: u64,
        end: u64,
    ) -> futures::future::BoxFuture<'_, std::io::Result<Bytes>> {
        let len = self.data.len() as u64;
        let r = if start > end || start > len {
            Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "range past end",
            ))
        } else {
            let e = end.min(len);
            self.requests.fetch_add(1, Ordering::Relaxed);
            self.bytes.fetch_add(e - start, Ordering::Relaxed);
            Ok(self.data.slice(start as usize..e as usize))
        };
        Box::pin(async move { r })
    }
}

pub(crate) const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/tiff");
pub(crate) const SHARED: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/data/geotiff");

pub(crate) fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!("{FIXTURES}/{name}")).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// An input the `tiff_decode` fuzzer found, committed beside its target.
pub(crate) fn fuzz_regression(name: &str) -> Vec<u8> {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fuzz/regressions/tiff_decode"
    );
    std::fs::read(format!("{dir}/{name}"))
        .unwrap_or_else(|e| panic!("the fuzz regression input {name} is committed: {e}"))
}

pub(crate) fn open_bytes(data: Vec<u8>) -> Result<TiffFile, TiffError> {
    open_with(data, TiffLimits::default())
}

pub(crate) fn open_with(data: Vec<u8>, limits: TiffLimits) -> Result<TiffFile, TiffError> {
    futures::executor::block_on(TiffFile::open(MemReader::new(data), limits))
}

pub(crate) fn dtype(name: &str) -> SampleType {
    match name {
        "Byte" => SampleType::U8,
        "UInt16" => SampleType::U16,
        "Int16" => SampleType::I16,
        "UInt32" => SampleType::U32,
        "Float32" => SampleType::F32,
        "Float64" => SampleType::F64,
        o => panic!("dtype {o}"),
    }
}

/// Little-endian raw samples (GDAL's ENVI output) as f64.
pub(crate) fn raw_values(bytes: &[u8], t: SampleType) -> Vec<f64> {
    bytes
        .chunks_exact(t.size())
        .map(|c| match t {
            SampleType::U8 => c[0] as f64,
            SampleType::U16 => u16::from_le_bytes([c[0], c[1]]) as f64,
            SampleType::I16 => i16::from_le_bytes([c[0], c[1]]) as f64,
            SampleType::U32 => u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64,
            SampleType::F32 => f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64,
            SampleType::F64 => f64::from_le_bytes(c.try_into().unwrap()),
        })
        .collect()
}

/// Compares a window (which may extend past the raster) with GDAL's values for
/// its in-raster part. Returns (max abs diff, mean abs diff).
#[allow(clippy::too_many_arguments)]
pub(crate) fn compare(
    got: &super::WindowData,
    expected: &[f64],
    x: i64,
    y: i64,
    raster_w: u32,
    raster_h: u32,
    what: &str,
) -> (f64, f64) {
    let (w, h) = (got.width as i64, got.height as i64);
    let cw = (x + w).min(raster_w as i64) - x.max(0);
    let ch = (y + h).min(raster_h as i64) - y.max(0);
    assert!(cw > 0 && ch > 0, "{what}: empty clip");
    assert_eq!(
        expected.len() as i64,
        cw * ch * got.bands as i64,
        "{what}: expected size"
    );
    let (mut max, mut sum, mut n) = (0.0f64, 0.0f64, 0u64);
    for b in 0..got.bands as i64 {
        for r in 0..h {
            for c in 0..w {
                let v = got.values.get((b * w * h + r * w + c) as usize);
                let (ix, iy) = (x + c, y + r);
                if ix < 0 || iy < 0 || ix >= raster_w as i64 || iy >= raster_h as i64 {
                    assert_eq!(v, 0.0, "{what}: padding value");
                    assert!(
                        !got.valid[(r * w + c) as usize],
                        "{what}: padding must be invalid"
                    );
                    continue;
                }
                let e = expected[(b * cw * ch + (iy - y.max(0)) * cw + (ix - x.max(0))) as usize];
                let d = if e.is_nan() && v.is_nan() {
                    0.0
                } else {
                    (e - v).abs()
                };
                assert!(
                    !d.is_nan(),
                    "{what}: NaN mismatch at band {b} ({ix},{iy}): {v} vs {e}"
                );
                max = max.max(d);
                sum += d;
                n += 1;
            }
        }
    }
    (max, sum / n as f64)
}
