//! Range reads of one object for the raster readers; the locations
//! themselves are `rsembed-store`'s.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::FutureExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use rsembed_raster::tiff::RangeRead;
pub use rsembed_store::{Location, StoreCache};

/// Range reads of one object, counted.
pub struct StoreRange {
    store: Arc<dyn ObjectStore>,
    path: Path,
    size: u64,
    bytes_read: Arc<AtomicU64>,
}

impl StoreRange {
    /// A reader of `path`, whose size the listing or a HEAD gave.
    pub fn new(
        store: Arc<dyn ObjectStore>,
        path: Path,
        size: u64,
        bytes_read: Arc<AtomicU64>,
    ) -> Self {
        StoreRange {
            store,
            path,
            size,
            bytes_read,
        }
    }
}

impl RangeRead for StoreRange {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_range(&self, start: u64, end: u64) -> BoxFuture<'_, std::io::Result<Bytes>> {
        async move {
            let end = end.min(self.size);
            if start >= end {
                return Ok(Bytes::new());
            }
            let b = self
                .store
                .get_range(&self.path, start..end)
                .await
                .map_err(std::io::Error::other)?;
            self.bytes_read.fetch_add(b.len() as u64, Ordering::Relaxed);
            Ok(b)
        }
        .boxed()
    }
}
