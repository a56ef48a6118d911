//! The rows of `stac/items.parquet`, built as Arrow columns straight from each
//! chip file's manifest entry and extent: the facts [`item()`] turns into a
//! JSON item (`each_row_reads_back_as_the_json_item_of_its_file` holds a row
//! and its JSON item equal), without building the item. Building items,
//! flattening them and decoding them through JSON was most of `finalize`'s
//! time at 10⁶ chip files.
//!
//! [`item()`]: super::item::item

use std::sync::Arc;

use arrow_array::builder::{
    BinaryBuilder, BooleanBuilder, Int64Builder, StringBuilder, TimestampMicrosecondBuilder,
};
use arrow_array::{
    Array, ArrayRef, Float64Array, ListArray, RecordBatch, StringArray, StructArray,
    TimestampMicrosecondArray, UInt32Array,
};
use arrow_buffer::{NullBuffer, OffsetBuffer};
use arrow_schema::{DataType, FieldRef, Fields, SchemaRef};
use rsembed_raster::geo::polygon_wkb;
use rsembed_schemas::extent::FileExtent;
use rsembed_schemas::job::ManifestFile;

use super::item::{
    asset_href, asset_title, checksum, item_id, source_title, wide, ITEM_EXTENSIONS, SOURCE_RELS,
    UP, UP_RELS,
};
use super::{chrono_of, times_of, Context, GEOJSON, JSON, PARQUET};
use crate::error::{Error, Result};

/// A geometry as WKB, and its type name for the `geo` metadata.
pub(super) type Wkb = (Vec<u8>, &'static str);

/// `POLYGON EMPTY`: the geometry of an item without a footprint. GeoJSON
/// readers may take an empty geometry for null (RFC 7946, 3.1), and a null
/// in the column breaks readers: stac-geoparquet 0.8 fails on any, rustac
/// 0.2 on one beside both polygon types. The row's bbox stays null.
const EMPTY_POLYGON: [u8; 9] = [1, 3, 0, 0, 0, 0, 0, 0, 0];

/// One chip file's row, checked, before it goes into the columns. Made where
/// the items are built, on the runtime's threads.
pub(super) struct Row {
    id: String,
    file: ManifestFile,
    extent: FileExtent,
    times: (i64, i64, &'static str),
    /// `None` without a footprint (an item without geometry).
    bbox: Option<[f64; 4]>,
    geometry: Wkb,
}

impl Row {
    pub(super) fn new(ctx: &Context, file: ManifestFile, extent: FileExtent) -> Result<Row> {
        let id = item_id(&file)?.to_owned();
        let times = times_of(ctx, &extent);
        // Times a JSON item could not hold are refused here as there.
        chrono_of(times.0)?;
        chrono_of(times.1)?;
        // A bbox means a point, so a footprint: the item has a geometry.
        let bbox = extent.bbox();
        let geometry = match bbox {
            Some(_) => wkb(&extent.footprint)?,
            None => (EMPTY_POLYGON.to_vec(), "Polygon"),
        };
        Ok(Row {
            id,
            file,
            extent,
            times,
            bbox,
            geometry,
        })
    }

    /// The item's id.
    pub(super) fn id(&self) -> &str {
        &self.id
    }

    /// The item's bbox.
    pub(super) fn bbox(&self) -> Option<[f64; 4]> {
        self.bbox
    }
}

/// Little-endian WKB of a footprint as `item()` writes its GeoJSON: a
/// Polygon for one ring, else a MultiPolygon of one-ring polygons; rings
/// closed. Each polygon is the readers' own (`polygon_wkb`, which writes the
/// chips' footprints).
fn wkb(footprint: &[Vec<[f64; 2]>]) -> Result<Wkb> {
    let too_large = || Error::Output("a footprint too large for WKB".into());
    let polygon = |ring: &[[f64; 2]]| -> Result<Vec<u8>> {
        u32::try_from(ring.len() + 1).map_err(|_| too_large())?;
        let closed: Vec<(f64, f64)> = ring
            .iter()
            .chain(ring.first())
            .map(|p| (p[0], p[1]))
            .collect();
        Ok(polygon_wkb(&closed))
    };
    if let [one] = footprint {
        return Ok((polygon(one)?, "Polygon"));
    }
    let n = u32::try_from(footprint.len()).map_err(|_| too_large())?;
    let mut out = vec![1];
    out.extend_from_slice(&6u32.to_le_bytes());
    out.extend_from_slice(&n.to_le_bytes());
    for ring in footprint {
        out.extend(polygon(ring)?);
    }
    Ok((out, "MultiPolygon"))
}

/// What every row of a job holds alike.
pub(super) struct JobColumns {
    /// The collection's id.
    pub(super) collection: String,
    /// `processing:datetime`, µs.
    pub(super) created_us: i64,
    /// `emb:runtime_parameters`, one row.
    pub(super) params: ArrayRef,
}

/// The columns of rows added so far.
#[derive(Default)]
pub(super) struct Columns {
    len: usize,
    ids: StringBuilder,
    geometries: BinaryBuilder,
    bbox: [Vec<f64>; 4],
    bbox_valid: Vec<bool>,
    link_offsets: Vec<i32>,
    link_href: StringBuilder,
    link_rel: StringBuilder,
    link_type: StringBuilder,
    link_title: StringBuilder,
    asset_href: StringBuilder,
    asset_title: StringBuilder,
    asset_size: Int64Builder,
    asset_checksum: StringBuilder,
    datetime: TimestampMicrosecondBuilder,
    start: TimestampMicrosecondBuilder,
    end: TimestampMicrosecondBuilder,
    source: StringBuilder,
    undated: Int64Builder,
    chips: Int64Builder,
    more_sources: BooleanBuilder,
    wide: BooleanBuilder,
}

impl Columns {
    /// Rows added and not yet taken.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Adds `row`; returns its geometry's type name.
    pub(super) fn push(&mut self, row: Row) -> &'static str {
        let Row {
            id,
            file,
            extent,
            times: (start, end, source),
            bbox,
            geometry,
        } = row;
        self.len += 1;
        self.ids.append_value(&id);
        self.geometries.append_value(&geometry.0);
        for (col, v) in self.bbox.iter_mut().zip(bbox.unwrap_or_default()) {
            col.push(v);
        }
        self.bbox_valid.push(bbox.is_some());

        if self.link_offsets.is_empty() {
            self.link_offsets.push(0);
        }
        let mut links = 0;
        let mut link = |href: &str, rel: &str, t: &str, title: Option<String>| {
            self.link_href.append_value(href);
            self.link_rel.append_value(rel);
            self.link_type.append_value(t);
            self.link_title.append_option(title);
            links += 1;
        };
        for rel in UP_RELS {
            link(UP, rel, JSON, None);
        }
        for rel in SOURCE_RELS {
            for (uri, id) in &extent.sources {
                link(uri, rel, GEOJSON, Some(source_title(id)));
            }
        }
        let last = *self.link_offsets.last().expect("starts at 0");
        self.link_offsets.push(last + links);

        self.asset_href.append_value(asset_href(&file));
        self.asset_title.append_value(asset_title(&file));
        self.asset_size
            .append_value(i64::try_from(file.bytes).unwrap_or(i64::MAX));
        self.asset_checksum.append_value(checksum(&file));

        if start == end {
            self.datetime.append_value(start);
            self.start.append_null();
            self.end.append_null();
        } else {
            self.datetime.append_null();
            self.start.append_value(start);
            self.end.append_value(end);
        }
        self.source.append_value(source);
        self.undated.append_option(
            (extent.start.is_some() && extent.undated > 0)
                .then(|| i64::try_from(extent.undated).unwrap_or(i64::MAX)),
        );
        self.chips
            .append_value(i64::try_from(file.rows).unwrap_or(i64::MAX));
        self.more_sources
            .append_option(extent.more_sources.then_some(true));
        self.wide.append_option(wide(&extent).then_some(true));
        geometry.1
    }

    /// The rows added, as a batch of `schema` (see `geoparquet.rs`), with the
    /// job's one `params` row repeated; the columns start empty again.
    pub(super) fn take(&mut self, job: &JobColumns, schema: &SchemaRef) -> Result<RecordBatch> {
        let n = std::mem::take(&mut self.len);
        let wrap = |e: arrow_schema::ArrowError| Error::Output(format!("stac/items.parquet: {e}"));
        let repeat = |s: &str| Arc::new(StringArray::from_iter_values(std::iter::repeat_n(s, n)));
        let fields = schema.fields();
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(fields.len());
        for f in fields {
            let c: ArrayRef = match f.name().as_str() {
                "type" => repeat("Feature"),
                "stac_version" => repeat(&stac::STAC_VERSION.to_string()),
                "stac_extensions" => {
                    let values = StringArray::from_iter_values(
                        (0..n).flat_map(|_| ITEM_EXTENSIONS.iter().copied()),
                    );
                    list_of(f, Arc::new(values), ITEM_EXTENSIONS.len(), n)
                }
                "id" => Arc::new(self.ids.finish()),
                "geometry" => Arc::new(self.geometries.finish()),
                "bbox" => {
                    let children: Vec<ArrayRef> = self
                        .bbox
                        .iter_mut()
                        .map(|v| Arc::new(Float64Array::from(std::mem::take(v))) as ArrayRef)
                        .collect();
                    let valid = NullBuffer::from(std::mem::take(&mut self.bbox_valid));
                    Arc::new(
                        StructArray::try_new(struct_fields(f), children, Some(valid))
                            .map_err(wrap)?,
                    )
                }
                "links" => {
                    let item = list_item(f);
                    let values = StructArray::try_new(
                        struct_fields(&item),
                        vec![
                            Arc::new(self.link_href.finish()),
                            Arc::new(self.link_rel.finish()),
                            Arc::new(self.link_type.finish()),
                            Arc::new(self.link_title.finish()),
                        ],
                        None,
                    )
                    .map_err(wrap)?;
                    let mut offsets = std::mem::take(&mut self.link_offsets);
                    if offsets.is_empty() {
                        offsets.push(0);
                    }
                    Arc::new(
                        ListArray::try_new(
                            item,
                            OffsetBuffer::new(offsets.into()),
                            Arc::new(values),
                            None,
                        )
                        .map_err(wrap)?,
                    )
                }
                "assets" => {
                    let embeddings = &struct_fields(f)[0];
                    let asset_fields = struct_fields(embeddings);
                    let roles_field = &asset_fields[3];
                    let asset = StructArray::try_new(
                        asset_fields.clone(),
                        vec![
                            Arc::new(self.asset_href.finish()),
                            Arc::new(self.asset_title.finish()),
                            repeat(PARQUET),
                            list_of(
                                roles_field,
                                Arc::new(StringArray::from_iter_values(std::iter::repeat_n(
                                    "data", n,
                                ))),
                                1,
                                n,
                            ),
                            Arc::new(self.asset_size.finish()),
                            Arc::new(self.asset_checksum.finish()),
                        ],
                        None,
                    )
                    .map_err(wrap)?;
                    Arc::new(
                        StructArray::try_new(struct_fields(f), vec![Arc::new(asset)], None)
                            .map_err(wrap)?,
                    )
                }
                "collection" => repeat(&job.collection),
                "datetime" => utc(self.datetime.finish()),
                "start_datetime" => utc(self.start.finish()),
                "end_datetime" => utc(self.end.finish()),
                "rsembed:datetime_source" => Arc::new(self.source.finish()),
                "rsembed:chips_without_datetime" => Arc::new(self.undated.finish()),
                "rsembed:chips" => Arc::new(self.chips.finish()),
                "rsembed:more_sources" => Arc::new(self.more_sources.finish()),
                "rsembed:wide_footprint" => Arc::new(self.wide.finish()),
                "processing:datetime" => {
                    utc(TimestampMicrosecondArray::from(vec![job.created_us; n]))
                }
                "emb:runtime_parameters" => {
                    arrow_select::take::take(&job.params, &UInt32Array::from(vec![0u32; n]), None)
                        .map_err(wrap)?
                }
                other => {
                    return Err(Error::Output(format!(
                        "stac/items.parquet: no values for column `{other}`"
                    )))
                }
            };
            columns.push(c);
        }
        RecordBatch::try_new(schema.clone(), columns).map_err(wrap)
    }
}

fn utc(a: TimestampMicrosecondArray) -> ArrayRef {
    Arc::new(a.with_timezone("UTC"))
}

/// The fields of a struct column.
fn struct_fields(f: &FieldRef) -> Fields {
    match f.data_type() {
        DataType::Struct(fields) => fields.clone(),
        t => unreachable!("{} is a struct in the schema, not {t}", f.name()),
    }
}

/// The item field of a list column.
fn list_item(f: &FieldRef) -> FieldRef {
    match f.data_type() {
        DataType::List(item) => item.clone(),
        t => unreachable!("{} is a list in the schema, not {t}", f.name()),
    }
}

/// A list column of `n` rows of `each` values apiece.
fn list_of(f: &FieldRef, values: ArrayRef, each: usize, n: usize) -> ArrayRef {
    debug_assert_eq!(values.len(), each * n);
    Arc::new(ListArray::new(
        list_item(f),
        OffsetBuffer::from_lengths(std::iter::repeat_n(each, n)),
        values,
        None,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wkb_of_two_rings_is_a_multipolygon_of_closed_rings() {
        let (b, name) = wkb(&[
            vec![[0.0, 0.0], [1.0, 0.0], [1.0, 1.0]],
            vec![[5.0, 5.0], [6.0, 5.0], [6.0, 6.0]],
        ])
        .unwrap();
        assert_eq!(name, "MultiPolygon");
        // Header, count, then two polygons of one ring of four points.
        assert_eq!(b.len(), 9 + 2 * (9 + 4 + 4 * 16));
        assert_eq!(&b[..5], &[1, 6, 0, 0, 0]);
        let (one, name) = wkb(&[vec![[0.0, 0.0], [1.0, 0.0], [1.0, 1.0]]]).unwrap();
        assert_eq!(name, "Polygon");
        assert_eq!(one.len(), 9 + 4 + 4 * 16);
        assert_eq!(
            &one[one.len() - 16..],
            &[0u8; 16],
            "closed on its first point"
        );
    }
}
