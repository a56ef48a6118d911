//! What the planner learns of each input's size: the chip blocks a large
//! scene is split into, and (for `plan`'s estimate) every scene's chip grid
//! and bytes, from a STAC item's `proj:shape` and `file:size` without a read,
//! else from TIFF headers and HEAD requests.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use object_store::ObjectStoreExt;
use rsembed_raster::scene::{plan_band_grid, plan_grid, planned_layout};
use rsembed_raster::tiff::{RangeRead, TiffLimits};
use rsembed_schemas::job::TilingSpec;
use rsembed_schemas::task::{ChipBlock, TaskInput};
use rsembed_worker::input::InputKind;
use rsembed_worker::store::{StoreCache, StoreRange};

/// How the planner splits large scenes into tasks of chip blocks.
#[derive(Clone)]
pub struct Sharding {
    /// Stores for reading TIFF headers.
    pub stores: StoreCache,
    /// The job's tiling (chip size and stride decide the grid).
    pub tiling: TilingSpec,
    /// TIFFs smaller than this are not opened by the planner: they stay one task
    /// input, and the worker cuts them.
    pub min_bytes: u64,
    /// Reader bounds for the header read.
    pub limits: TiffLimits,
    /// Measure every input for the plan's estimate (`rsembed plan`): read
    /// the headers of TIFFs too small to split, and ask the store for the
    /// size of STAC assets without `file:size`. The tasks are the same.
    pub estimate: bool,
}

/// What the planner knows of one input's size.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Measure {
    /// The chip blocks the input is split into; `None`: one task input.
    pub(super) blocks: Option<Vec<ChipBlock>>,
    /// Its grid chips, before any is dropped (no valid pixel, `--min-valid`,
    /// `--max-cloud`): from `proj:shape` or a TIFF header, 1 for a whole
    /// image, 0 for an item that is an error record. `None`: not known (an
    /// archive, a header not read or not readable). Under `--align crs` an
    /// upper bound: a scene's place on the lattice adds up to a column and a
    /// row of chips, and the planner does not read it.
    pub(super) chips: Option<u64>,
}

impl Measure {
    fn chips(n: u64) -> Measure {
        Measure {
            blocks: None,
            chips: Some(n),
        }
    }
}

/// How many inputs are measured at once: header reads and HEADs take an
/// object store tens of milliseconds each, and the plan's order is kept.
pub(super) const MEASURE_IN_FLIGHT: usize = 16;

/// Fills in the sizes a STAC item did not give (`file:size`), by HEAD; a
/// part the store cannot answer for stays 0 and the worker records why.
async fn fill_sizes(s: &Sharding, input: &mut TaskInput) {
    for p in input.parts.iter_mut().filter(|p| p.size == 0) {
        let Ok(loc) = s.stores.location(&p.uri) else {
            continue;
        };
        if let Ok(meta) = loc.store.head(&loc.prefix).await {
            p.size = meta.size;
        }
    }
    input.size = input.parts.iter().map(|p| p.size).sum();
}

/// A STAC item whose one selected asset is a PNG, JPEG or other whole image
/// (by its name): one chip, as the same file in a folder is.
fn is_image_item(input: &TaskInput) -> bool {
    input.item.as_ref().is_some_and(|i| i.mask.is_none())
        && matches!(&input.parts[..], [p] if InputKind::of(&p.uri) == Some(InputKind::Image))
}

/// Measures an input and splits a large georeferenced scene into chip blocks
/// of about `task_size` chips (`None` blocks leave it whole). A STAC item's
/// scene is split by its `proj:shape` without a read; a TIFF at least
/// `min_bytes` large by its header. With `estimate` (`plan`), the headers of
/// smaller TIFFs are read too, and STAC assets without `file:size` are asked
/// for their size, so the plan can count chips and bytes; the split is the
/// same either way.
///
/// A header that cannot be read is not a planning error: the input goes to a
/// worker as it is, and the worker records why it fails.
pub(super) async fn measure(s: &Sharding, input: &mut TaskInput, task_size: usize) -> Measure {
    if let Some(item) = &input.item {
        if item.error.is_some() || input.parts.is_empty() {
            return Measure::chips(0);
        }
        if is_image_item(input) {
            if s.estimate {
                fill_sizes(s, input).await;
            }
            return Measure::chips(1);
        }
        if let Some([width, height]) = item.grid {
            if s.estimate {
                fill_sizes(s, input).await;
            }
            // A shape is given for a georeferenced scene (proj:shape).
            let Some(grid) = planned_layout(width, height, true, &s.tiling) else {
                // Only a scene split by its shape needs the worker to check it.
                if let Some(item) = &mut input.item {
                    item.grid = None;
                }
                return Measure::chips(1);
            };
            let blocks = (grid.len() > task_size as u64).then(|| grid.blocks(task_size));
            if blocks.is_none() {
                if let Some(item) = &mut input.item {
                    item.grid = None;
                }
            }
            return Measure {
                blocks,
                chips: Some(grid.len()),
            };
        }
        fill_sizes(s, input).await;
        if input.parts.iter().any(|p| p.size == 0) {
            return Measure::default();
        }
    } else if input.parts.is_empty() {
        match InputKind::of(&input.uri) {
            Some(InputKind::Scene) => {}
            Some(InputKind::Image) => return Measure::chips(1),
            // An archive's members are counted by the worker that opens it.
            Some(InputKind::Archive) | None => return Measure::default(),
        }
    }
    let split = input.size >= s.min_bytes;
    if !split && !s.estimate {
        return Measure::default();
    }
    let Some(grid) = header_grid(s, input).await else {
        return Measure::default();
    };
    Measure {
        chips: Some(grid.as_ref().map_or(1, |g| g.len())),
        blocks: grid
            .filter(|g| split && g.len() > task_size as u64)
            .map(|g| g.blocks(task_size)),
    }
}

/// The chip grid of a TIFF scene (one file or its band files) from its
/// headers: `Some(None)` for a whole-image chip, `None` when it cannot be
/// read or is not a scene the worker would cut.
async fn header_grid(
    s: &Sharding,
    input: &TaskInput,
) -> Option<Option<rsembed_raster::grid::ChipGrid>> {
    let reader = |uri: &str, size: u64| -> Option<Arc<dyn RangeRead>> {
        let loc = s.stores.location(uri).ok()?;
        Some(Arc::new(StoreRange::new(
            loc.store.clone(),
            loc.prefix.clone(),
            size,
            Arc::new(AtomicU64::new(0)),
        )))
    };
    if input.parts.is_empty() {
        return plan_grid(reader(&input.uri, input.size)?, &s.tiling, s.limits.clone())
            .await
            .ok();
    }
    // A scene missing a band stays one input, so it is one error record.
    let wanted = match &input.item {
        Some(_) => input.parts.len(),
        None => s.tiling.band_files.as_ref().map_or(0, Vec::len),
    };
    if input.parts.len() != wanted
        || !input
            .parts
            .iter()
            .all(|p| InputKind::of(&p.uri) == Some(InputKind::Scene))
    {
        return None;
    }
    let readers = input
        .parts
        .iter()
        .map(|p| reader(&p.uri, p.size))
        .collect::<Option<Vec<_>>>()?;
    plan_band_grid(readers, &s.tiling, s.limits.clone())
        .await
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rsembed_raster::tiff::TiffLimits;
    use rsembed_schemas::job::TilingSpec;
    use rsembed_schemas::task::{BandFile, ItemInfo};
    use rsembed_worker::store::StoreCache;

    fn sharding(estimate: bool) -> Sharding {
        Sharding {
            stores: StoreCache::default(),
            tiling: TilingSpec {
                chip_size: 256,
                stride: 256,
                bands: vec![1, 2, 3],
                scale: "auto".into(),
                min_valid: None,
                band_files: None,
                assets: None,
                cloud_mask: None,
                max_cloud: None,
                footprint_tolerance: None,
                embedding_type: Default::default(),
                align: Default::default(),
                windows: None,
                schema_version: rsembed_schemas::SCHEMA_VERSION,
            },
            min_bytes: 16 << 20,
            limits: TiffLimits::default(),
            estimate,
        }
    }

    fn item_input(part: &str, grid: Option<[u32; 2]>, error: Option<&str>) -> TaskInput {
        TaskInput {
            uri: "http://h/collections/c/items/a".into(),
            size: 10,
            version: None,
            chips: None,
            parts: vec![BandFile {
                suffix: "visual".into(),
                uri: part.into(),
                size: 10,
                version: None,
                bands: vec![1, 2, 3],
            }],
            item: Some(Box::new(ItemInfo {
                id: "a".into(),
                collection: None,
                datetime: None,
                end_datetime: None,
                cloud_cover: None,
                units: vec![],
                mask: None,
                grid,
                proj: None,
                error: error.map(str::to_owned),
            })),
        }
    }

    #[tokio::test]
    async fn items_are_measured_by_their_shape_without_a_read() {
        let s = sharding(false);
        // 600 x 520: a 3 x 3 grid of 256² chips, split in blocks of 4.
        let mut i = item_input("s3://b/v.tif", Some([600, 520]), None);
        let m = measure(&s, &mut i, 4).await;
        assert_eq!(m.chips, Some(9));
        assert_eq!(m.blocks.as_ref().map(Vec::len), Some(4));
        assert_eq!(i.item.as_ref().unwrap().grid, Some([600, 520]));
        // Not split: counted all the same, and the worker need not check.
        let mut i = item_input("s3://b/v.tif", Some([600, 520]), None);
        let m = measure(&s, &mut i, 64).await;
        assert_eq!((m.chips, m.blocks), (Some(9), None));
        assert_eq!(i.item.as_ref().unwrap().grid, None);
        let mut i = item_input("s3://b/v.tif", Some([200, 100]), None);
        assert_eq!(measure(&s, &mut i, 4).await, Measure::chips(1));
        // A PNG asset is one whole image, whatever proj:shape says.
        let mut i = item_input("s3://b/v.png", Some([6000, 6000]), None);
        assert_eq!(measure(&s, &mut i, 4).await, Measure::chips(1));
        // An error record makes no chip.
        let mut i = item_input("s3://b/v.tif", None, Some("no asset"));
        assert_eq!(measure(&s, &mut i, 4).await, Measure::chips(0));
        // Files: an image is one chip, an archive is not opened.
        let file = |uri: &str| TaskInput {
            uri: uri.into(),
            size: 10,
            version: None,
            chips: None,
            parts: vec![],
            item: None,
        };
        assert_eq!(
            measure(&s, &mut file("s3://b/a.jpg"), 4).await,
            Measure::chips(1)
        );
        assert_eq!(
            measure(&s, &mut file("s3://b/a.tar"), 4).await,
            Measure::default()
        );
        // A small TIFF's header is read only for the estimate.
        assert_eq!(
            measure(&s, &mut file("s3://b/a.tif"), 4).await,
            Measure::default()
        );
    }
}
