//! Shared by the fuzz targets: the fuzz input as an in-memory object.

use std::sync::Arc;

use bytes::Bytes;
use rsembed_raster::tiff::RangeRead;

/// The fuzz input served as an object-store object.
pub struct MemReader(pub Bytes);

impl MemReader {
    pub fn new(data: &[u8]) -> Arc<dyn RangeRead> {
        Arc::new(MemReader(Bytes::copy_from_slice(data)))
    }
}

impl RangeRead for MemReader {
    fn size(&self) -> u64 {
        self.0.len() as u64
    }

    fn read_range(
        &self,
        start: u64,
        end: u64,
    ) -> futures::future::BoxFuture<'_, std::io::Result<Bytes>> {
        // The reader must never ask for an inverted range; past-the-end
        // requests are legal for the trait (a short read), so serve those.
        assert!(start <= end, "read_range({start}, {end}): inverted range");
        let len = self.0.len() as u64;
        let r = if start > len {
            Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "range past end",
            ))
        } else {
            Ok(self.0.slice(start as usize..end.min(len) as usize))
        };
        Box::pin(async move { r })
    }
}
