//! STAC in and out: the items a STAC API search, a static catalog or an item
//! collection selects become scenes of the plan (`--input`), and a finished
//! job is described as a STAC Collection of its chip files (`<output>/stac/`).
//!
//! - `source.rs` decides what an `--input` is (an API root by its landing
//!   page's `conformsTo`, a catalog or collection, an item collection) and
//!   streams its items, page by page, with every document's size bounded;
//! - `search.rs` holds the search: what is sent to an API, and the same
//!   filters applied on the client;
//! - `scene.rs` turns one item into one task input: its assets in R,G,B order,
//!   their physical units, the cloud mask, the acquisition time;
//! - `out.rs` writes `<output>/stac/collection.json` and its items.

pub(crate) mod api;
pub(crate) mod catalog;
pub(crate) mod fetch;
pub(crate) mod items;
pub mod out;
pub mod scene;
pub mod search;
pub mod source;
