//! Pictures of search results: each hit's chip read again from its source by
//! the worker's own reader ([`rsembed_worker::input::ChipReader`]), for the
//! page of `search --html` (`rsembed_query::search::html`, which encodes them).
//!
//! A chip row names its source, its window and (in its file's `rsembed`
//! metadata) the tiling that cut it; from those the task input is rebuilt as
//! the planner made it: a file, a tar member, a `--band-files` scene (its
//! name holds the suffixes), or a STAC item (its document read again and
//! resolved by the planner's own `scene_of`).
//!
//! Decisions:
//! - The picture is the 8-bit image the model's normalization saw: the chip
//!   resized to the model's input size by the preprocessor's own resize, when
//!   `--model` is given; without it (`--like`, `--vector`), the chip at its
//!   own size, as the preprocessor received it.
//! - A hit whose source cannot be read is a placeholder with the reason,
//!   never a failed search: the results are already printed.

use futures::future::BoxFuture;
use rsembed_query::search::html::ChipImages;
use rsembed_query::search::SearchResult;
use rsembed_raster::image::Rgb8;
use rsembed_schemas::ids::Window;
use rsembed_schemas::job::TilingSpec;
use rsembed_schemas::task::{BandFile, TaskInput};
use rsembed_worker::input::ChipReader;
use rsembed_worker::model::ModelDir;
use rsembed_worker::preprocess::Preprocessor;
use rsembed_worker::store::StoreCache;
use serde_json::Value;
use url::Url;

use crate::stac::fetch::{Fetcher, MAX_DOCUMENT};
use crate::stac::scene::{scene_of, Selection};

/// The chips of search hits read again from their sources, for the page
/// of `search --html`; see the module's documentation.
pub(crate) struct SourceChips {
    stores: StoreCache,
    fetcher: Option<Fetcher>,
    pre: Option<Preprocessor>,
}

impl SourceChips {
    /// Chips resized as `model`'s preprocessor does, when given.
    pub(crate) fn new(model: Option<&ModelDir>) -> SourceChips {
        let stores = StoreCache::default();
        SourceChips {
            fetcher: Fetcher::new(&stores).ok(),
            stores,
            pre: model.map(|m| Preprocessor::new(&m.preprocessor)),
        }
    }

    async fn chip(&self, r: &SearchResult) -> Result<Rgb8, String> {
        let tiling = r.tiling.as_ref().ok_or(
            "its chip file has no rsembed metadata, so the tiling that cut the chip is unknown",
        )?;
        let input = input_of(self.fetcher.as_ref(), r, tiling).await?;
        let reader = ChipReader::new(self.stores.clone(), TilingSpec::clone(tiling))
            .map_err(|e| e.to_string())?;
        let window = Window {
            x: r.x,
            y: r.y,
            width: r.width,
            height: r.height,
        };
        let chip = reader
            .chip_rgb(&input, window)
            .await
            .map_err(|e| rsembed_worker::error::chain(&e))?;
        Ok(match &self.pre {
            Some(p) => p.resized(&chip).map_err(|e| e.to_string())?.into_owned(),
            None => chip,
        })
    }
}

impl ChipImages for SourceChips {
    fn chip<'a>(&'a self, r: &'a SearchResult) -> BoxFuture<'a, Result<Rgb8, String>> {
        Box::pin(SourceChips::chip(self, r))
    }
}

/// The task input the planner made for the chip's source.
async fn input_of(
    fetcher: Option<&Fetcher>,
    r: &SearchResult,
    tiling: &TilingSpec,
) -> Result<TaskInput, String> {
    let uri = &r.source_uri;
    let mut input = TaskInput {
        uri: uri.clone(),
        size: 0,
        version: None,
        chips: None,
        parts: vec![],
        item: None,
    };
    if let Some(id) = &r.item_id {
        let fetcher = fetcher.ok_or("no HTTP client for STAC documents")?;
        let (item, base) = stac_item(fetcher, uri, id).await?;
        let sel = Selection {
            assets: tiling.assets.clone(),
            // The mask gives a column, not pixels.
            mask: None,
            max_pixels: rsembed_raster::tiff::TiffLimits::default().max_pixels,
        };
        return Ok(scene_of(uri, &base, &item, &sel));
    }
    if let Some(suffixes) = &tiling.band_files {
        input.parts = band_files(uri, suffixes).ok_or_else(|| {
            format!("{uri} is not a --band-files scene name (`prefix{{A,B,C}}rest`)")
        })?;
    }
    Ok(input)
}

/// The files of a `--band-files` scene named `prefix{A,B,C}rest`, as the
/// planner names it.
fn band_files(uri: &str, suffixes: &[String]) -> Option<Vec<BandFile>> {
    let braces = format!("{{{}}}", suffixes.join(","));
    let at = uri.rfind(&braces)?;
    let (prefix, rest) = (&uri[..at], &uri[at + braces.len()..]);
    Some(
        suffixes
            .iter()
            .map(|s| BandFile {
                suffix: s.clone(),
                uri: format!("{prefix}{s}{rest}"),
                size: 0,
                version: None,
                bands: vec![],
            })
            .collect(),
    )
}

/// The STAC item `id` read again from `href`: its own document, or (an item
/// of an item collection without a self link, `<collection>#<id>`) the
/// collection's FeatureCollection or JSON lines; with the base its assets
/// resolve against. A stac-geoparquet collection is not read here: its
/// items' pictures are placeholders.
async fn stac_item(fetcher: &Fetcher, href: &str, id: &str) -> Result<(stac::Item, Url), String> {
    let mut doc = Url::parse(href).map_err(|e| format!("{href}: not a URL: {e}"))?;
    doc.set_fragment(None);
    let bytes = fetcher
        .read(doc.as_str(), MAX_DOCUMENT)
        .await
        .map_err(|e| rsembed_worker::error::chain(&e))?;
    let json: Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        // An item collection of one item per line.
        Err(e) => bytes
            .split(|&b| b == b'\n')
            .filter_map(|l| serde_json::from_slice::<Value>(l).ok())
            .find(|f| f.get("id").and_then(Value::as_str) == Some(id))
            .ok_or_else(|| format!("{doc}: neither JSON ({e}) nor lines holding item `{id}`"))?,
    };
    let feature = match json.get("type").and_then(Value::as_str) {
        Some("Feature") => json,
        Some("FeatureCollection") => json
            .get("features")
            .and_then(Value::as_array)
            .and_then(|fs| {
                fs.iter()
                    .find(|f| f.get("id").and_then(Value::as_str) == Some(id))
            })
            .cloned()
            .ok_or_else(|| format!("{doc}: no item `{id}` in it any more"))?,
        _ => {
            return Err(format!(
                "{doc}: the item cannot be read again from here (not an item or a \
                 FeatureCollection document)"
            ))
        }
    };
    let (_, base) = crate::stac::emit::href_of(&feature, &doc, doc.as_str());
    let item: stac::Item =
        serde_json::from_value(feature).map_err(|e| format!("{href}: not a STAC item: {e}"))?;
    if item.id != id {
        return Err(format!("{href}: its item is `{}`, not `{id}`", item.id));
    }
    Ok((item, base))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn band_file_scenes_expand_to_their_files() {
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let parts = band_files("s3://b/T1_{B4,B3,B2}.TIF", &s(&["B4", "B3", "B2"])).unwrap();
        let uris: Vec<&str> = parts.iter().map(|p| p.uri.as_str()).collect();
        assert_eq!(
            uris,
            ["s3://b/T1_B4.TIF", "s3://b/T1_B3.TIF", "s3://b/T1_B2.TIF"]
        );
        assert_eq!(parts[0].suffix, "B4");
        assert!(band_files("s3://b/T1_B4.TIF", &s(&["B4", "B3", "B2"])).is_none());
    }
}
