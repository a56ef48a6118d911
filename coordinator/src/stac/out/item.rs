//! The documents: the item of one chip file, from its [`FileExtent`], and the
//! collection over the items.

use rsembed_schemas::embedding::EmbeddingType;
use rsembed_schemas::extent::FileExtent;
use rsembed_schemas::job::{JobSpec, ManifestFile};
use serde_json::{json, Map, Value};
use stac::{Asset, Bbox, Collection, Item, ItemAsset, Link};

use super::link::{client_filter, source_link};
use super::{chrono_of, times_of, Context, Totals, EMBEDDINGS_EXTENSION, GEOJSON, JSON, PARQUET};
use crate::error::{Error, Result};

/// `processing:datetime`: when the embeddings were made (the proposal reuses it).
const PROCESSING_EXTENSION: &str =
    "https://stac-extensions.github.io/processing/v1.2.0/schema.json";
/// `file:size` and `file:checksum` of the embeddings asset, from the manifest.
pub(super) const FILE_EXTENSION: &str = "https://stac-extensions.github.io/file/v2.1.0/schema.json";
/// The collection's asset that is `stac/items.parquet`.
pub(crate) const ITEMS_PARQUET_ASSET: &str = "geoparquet-items";

/// The GeoJSON geometry of a footprint: a Polygon for one ring, else a
/// MultiPolygon; rings closed, as GeoJSON has them. `None` when empty.
fn geometry(footprint: &[Vec<[f64; 2]>]) -> Option<Value> {
    let closed = |ring: &Vec<[f64; 2]>| -> Value {
        let mut r: Vec<[f64; 2]> = ring.clone();
        r.extend(ring.first().copied());
        json!([r])
    };
    match footprint {
        [] => None,
        [one] => Some(json!({"type": "Polygon", "coordinates": closed(one)})),
        many => Some(json!({
            "type": "MultiPolygon",
            "coordinates": many.iter().map(closed).collect::<Vec<_>>(),
        })),
    }
}

/// The extensions every item implements.
pub(super) const ITEM_EXTENSIONS: [&str; 3] =
    [EMBEDDINGS_EXTENSION, PROCESSING_EXTENSION, FILE_EXTENSION];

/// Every item's links up to the collection: the href and its relations.
pub(super) const UP: &str = "../collection.json";
pub(super) const UP_RELS: [&str; 3] = ["root", "parent", "collection"];

/// The relations of the links to the STAC items the chips were cut from:
/// `derived_from` (STAC's relation for it) and the proposal's item-level
/// `emb:source-data`.
pub(super) const SOURCE_RELS: [&str; 2] = ["derived_from", "emb:source-data"];

/// The title of a link to a source item.
pub(super) fn source_title(id: &str) -> String {
    format!("source item {id}")
}

/// The item id of a chip file: its task id.
pub(super) fn item_id(file: &ManifestFile) -> Result<&str> {
    file.path
        .rsplit('/')
        .next()
        .and_then(|n| n.strip_suffix(".parquet"))
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            Error::Output(format!(
                "manifest: `{}` is not a chips/<task>.parquet path",
                file.path
            ))
        })
}

/// The `embeddings` asset's href, title and `file:checksum`.
pub(super) fn asset_href(file: &ManifestFile) -> String {
    format!("../../{}", file.path)
}
pub(super) fn asset_title(file: &ManifestFile) -> String {
    format!("chip embeddings ({} rows)", file.rows)
}
/// Multihash: 0x12 is SHA2-256, 0x20 its 32-byte length.
pub(super) fn checksum(file: &ManifestFile) -> String {
    format!("1220{}", file.sha256)
}

/// A polygon that runs the long way round in lon/lat (chips all around the
/// globe, which no outline of the vertex bound separates): the item says so
/// rather than let it pass for a place.
pub(super) fn wide(extent: &FileExtent) -> bool {
    extent.footprint.iter().any(|r| {
        let (lo, hi) = r.iter().fold((f64::MAX, f64::MIN), |(lo, hi), p| {
            (lo.min(p[0]), hi.max(p[0]))
        });
        hi - lo > 180.0
    })
}

/// The item of one chip file. Its row of `stac/items.parquet` is built from
/// the same facts (`rows.rs`); a test holds the two equal.
pub(crate) fn item(ctx: &Context, file: &ManifestFile, extent: &FileExtent) -> Result<Item> {
    let mut item = Item::new(item_id(file)?).collection(&ctx.id);
    item.extensions = ITEM_EXTENSIONS.map(str::to_owned).to_vec();
    if let (Some(g), Some([x0, y0, x1, y1])) = (geometry(&extent.footprint), extent.bbox()) {
        item.geometry = Some(serde_json::from_value(g)?);
        item.bbox = Some(Bbox::new(x0, y0, x1, y1));
    }
    let p = &mut item.properties;
    let (start, end, source) = times_of(ctx, extent);
    if start == end {
        p.datetime = Some(chrono_of(start)?);
    } else {
        p.datetime = None;
        p.start_datetime = Some(chrono_of(start)?);
        p.end_datetime = Some(chrono_of(end)?);
    }
    let f = &mut p.additional_fields;
    f.insert("rsembed:datetime_source".into(), source.into());
    if extent.start.is_some() && extent.undated > 0 {
        f.insert(
            "rsembed:chips_without_datetime".into(),
            extent.undated.into(),
        );
    }
    f.insert("rsembed:chips".into(), file.rows.into());
    if extent.more_sources {
        f.insert("rsembed:more_sources".into(), true.into());
    }
    if wide(extent) {
        f.insert("rsembed:wide_footprint".into(), true.into());
    }
    f.insert(
        "processing:datetime".into(),
        serde_json::to_value(chrono_of(ctx.created_us)?)?,
    );
    f.insert("emb:runtime_parameters".into(), ctx.runtime_params.clone());

    for rel in UP_RELS {
        item.links.push(Link::new(UP, rel).r#type(JSON.to_owned()));
    }
    for rel in SOURCE_RELS {
        for (uri, id) in &extent.sources {
            item.links.push(
                Link::new(uri, rel)
                    .r#type(GEOJSON.to_owned())
                    .title(source_title(id)),
            );
        }
    }
    let mut asset = Asset::new(asset_href(file)).role("data");
    asset.r#type = Some(PARQUET.to_owned());
    asset.title = Some(asset_title(file));
    asset
        .additional_fields
        .insert("file:size".into(), file.bytes.into());
    asset
        .additional_fields
        .insert("file:checksum".into(), checksum(file).into());
    item.assets.insert("embeddings".into(), asset);
    Ok(item)
}

/// `emb:runtime_parameters` of every item of a job: its tiling as `job.json`
/// has it, and the filter rsembed applied to a STAC search itself.
pub(crate) fn runtime_params(spec: &JobSpec) -> Result<Value> {
    let mut params = serde_json::to_value(&spec.tiling)?;
    if let (Some(cf), Some(o)) = (
        client_filter(&spec.input, spec.search.as_ref()),
        params.as_object_mut(),
    ) {
        o.insert("client_filter".into(), cf.into());
    }
    Ok(params)
}

/// The collection over the items `ids` whose chips `totals` covers.
pub(crate) fn collection(
    ctx: &Context,
    ids: &[String],
    totals: &Totals,
    data_type: &str,
) -> Result<Collection> {
    let spec = &ctx.spec;
    let m = &spec.model;
    let mut c = Collection::new(
        &ctx.id,
        format!(
            "Chip embeddings of {} by the model {} ({} dimensions), one item per chip file; \
             made by {}, job {}.",
            spec.input, m.name, m.embed_dim, spec.software_version, spec.job_id
        ),
    );
    c.title = Some(format!("{} chip embeddings", m.name));
    c.extensions = vec![EMBEDDINGS_EXTENSION.to_owned()];
    c.extent.spatial.bbox = vec![match totals.bbox {
        Some([x0, y0, x1, y1]) => Bbox::new(x0, y0, x1, y1),
        // No chip has a footprint: the whole world is what is known.
        None => Bbox::new(-180.0, -90.0, 180.0, 90.0),
    }];
    let (start, end) = match (totals.start, totals.end) {
        (Some(s), Some(e)) => (s, e),
        _ => (ctx.created_us, ctx.created_us),
    };
    c.extent.temporal.interval = vec![[Some(chrono_of(start)?), Some(chrono_of(end)?)]];

    let f = &mut c.additional_fields;
    f.insert("emb:type".into(), "chip".into());
    f.insert("emb:dimensions".into(), m.embed_dim.into());
    f.insert("data_type".into(), data_type.into());
    // How to get float32 values back from f16 or int8 files: the same
    // record as their `rsembed` metadata's `quantization`.
    if let Some(q) = data_type
        .parse::<EmbeddingType>()
        .ok()
        .and_then(|t| t.quantization())
    {
        f.insert(
            "emb:quantization".into(),
            serde_json::to_value(q).map_err(|e| Error::Output(e.to_string()))?,
        );
    }
    let t = &spec.tiling;
    f.insert("emb:chip_layout".into(), chip_layout(t));
    f.insert("emb:temporal_resolution".into(), temporal_resolution(t));
    f.insert(
        "rsembed:model".into(),
        json!({
            "name": m.name,
            "sha256": m.sha256,
            "preprocessor_sha256": m.preprocessor_sha256,
            "fp16": m.fp16,
        }),
    );
    f.insert("rsembed:job_id".into(), spec.job_id.clone().into());
    f.insert("rsembed:chips".into(), totals.rows.into());

    c.item_assets.insert(
        "embeddings".into(),
        ItemAsset {
            title: Some("Chip embeddings".into()),
            description: Some(
                "rsembed chip rows (GeoParquet): footprint, source, and the embedding".into(),
            ),
            r#type: Some(PARQUET.into()),
            roles: vec!["data".into()],
            additional_fields: Map::new(),
        },
    );

    c.links
        .push(Link::new("./collection.json", "root").r#type(JSON.to_owned()));
    c.links.push(
        Link::new("../job.json", "emb:model")
            .r#type(JSON.to_owned())
            .title(format!(
                "{} (vision graph sha256 {}); job.json holds every model file's digest",
                m.name, m.sha256
            )),
    );
    c.links
        .push(source_link(&spec.input, spec.search.as_ref())?);
    for id in ids {
        c.links
            .push(Link::new(format!("./items/{id}.json"), "item").r#type(GEOJSON.to_owned()));
    }
    Ok(c)
}

/// `emb:chip_layout`: the regular grid of chips, and where it starts. Under
/// `--align crs` it is the CRS's pixel lattice, the same for every scene of
/// one CRS and resolution, and each chip names its cell; from schema 3 every
/// georeferenced chip also names its Major TOM 10 km cell.
pub(crate) fn chip_layout(t: &rsembed_schemas::job::TilingSpec) -> serde_json::Value {
    let mut layout = json!({
        "layout_type": "regular_grid",
        "chip_size": [t.chip_size, t.chip_size],
        "stride": [t.stride, t.stride],
        "grid": t.align.as_str(),
    });
    if t.align == rsembed_schemas::align::Align::Crs {
        layout["grid_origin"] = "crs".into();
        layout["cell_column"] = "cell".into();
        layout["cell_format"] = "EPSG:<code>/<res>/<stride>/<col>/<row>".into();
    } else {
        layout["grid_origin"] = "scene".into();
    }
    if t.schema_version >= 3 {
        layout["grid_cell_column"] = "grid_cell".into();
        layout["grid_cell_grid"] = "Major TOM 10 km (arXiv 2402.12095)".into();
    }
    layout
}

/// `emb:temporal_resolution`: the window duration of a window job (one
/// composite a window and cell, `P3M`), or `acquisition` (one embedding an
/// acquisition).
pub(crate) fn temporal_resolution(t: &rsembed_schemas::job::TilingSpec) -> serde_json::Value {
    match &t.windows {
        Some(w) => json!({ "window": w.duration, "composite": w.composite.as_str() }),
        None => "acquisition".into(),
    }
}
