//! STAC in and out: the items a STAC API search, a static catalog or an item
//! collection selects become scenes of the plan (`--input`), and a finished
//! job is described as a STAC Collection of its chip files (`<output>/stac/`).
//!
//! - `detect.rs` decides what an `--input` is (an API root by its landing
//!   page's `conformsTo`, a catalog or collection, an API collection or item
//!   URL, an item collection) and refuses JSON that is not STAC;
//! - `source.rs` streams its items, page by page, with every document's size
//!   bounded, and fails a search that selects nothing;
//! - `search.rs` holds the search: what is sent to an API, and the same
//!   filters applied on the client;
//! - `scene.rs` turns one item into one task input: its assets in R,G,B order,
//!   their physical units, the cloud mask, the acquisition time, and
//!   (`proj.rs`) where its grid lies in its CRS;
//! - `out.rs` writes `<output>/stac/collection.json` and its items.

pub(crate) mod api;
pub(crate) mod catalog;
pub(crate) mod detect;
pub(crate) mod emit;
pub(crate) mod fetch;
pub(crate) mod items;
pub mod out;
mod proj;
pub mod scene;
pub mod search;
pub mod source;

use rsembed_schemas::job::{StacSearch, TilingSpec};
use rsembed_worker::store::{Location, StoreCache};

use crate::cli::StacArgs;
use crate::error::{Error, Result};
use crate::job::plan::{Source, StacSource};

/// A job's `--input`, resolved: its location, what the planner reads, and
/// the search the job spec records (for STAC inputs).
pub struct Resolved {
    /// The input's URL as stores open it.
    pub location: Location,
    /// What the planner reads.
    pub source: Source,
    /// The search of a STAC input; part of the job's identity.
    pub search: Option<StacSearch>,
}

/// Decides whether `input` is a STAC API, catalog or item collection, and
/// refuses the STAC flags for an input that is not one (they would select
/// nothing and say nothing).
pub async fn resolve(
    stores: &StoreCache,
    input: &str,
    tiling: &TilingSpec,
    flags: &StacArgs,
) -> Result<Resolved> {
    let location = stores.location(input)?;
    let Some(stac) = source::detect(stores, input).await? else {
        let asset_flags = tiling.assets.is_some() || tiling.cloud_mask.is_some();
        if flags.any() || asset_flags {
            return Err(Error::Usage(format!(
                "{input} is not a STAC API, catalog or item collection, so the STAC flags \
                 (--collections, --bbox, --datetime, --ids, --filter, --max-items, \
                 --cloud-cover-max, --assets, --cloud-mask, --windows) do not apply to it"
            )));
        }
        return Ok(Resolved {
            source: Source::Listing(location.clone()),
            location,
            search: None,
        });
    };
    let mut search = flags.search().map_err(Error::Usage)?;
    if let (source::StacInput::Api { conformance, .. }, Some(_)) = (&stac, search.cloud_cover_max) {
        search.cloud_cover_by = Some(api::cloud_cover_by(*conformance));
    }
    let selection = scene::Selection {
        assets: tiling.assets.clone(),
        mask: match &tiling.cloud_mask {
            Some(m) => Some(rsembed_schemas::task::parse_cloud_mask(m).map_err(Error::Usage)?),
            None => None,
        },
        max_pixels: rsembed_raster::tiff::TiffLimits::default().max_pixels,
    };
    Ok(Resolved {
        location,
        source: Source::Stac(Box::new(StacSource {
            input: stac,
            search: search.clone(),
            selection,
        })),
        search: Some(search),
    })
}
