//! Chip rows as Arrow record batches, in the chip schema of each version:
//! the one builder of every writer (the worker's sink, and the fixtures of
//! tests and benches that write chip files as a job does).

use std::sync::Arc;

use arrow_array::builder::{
    BinaryBuilder, Float32Builder, Float64Builder, Int32Builder, StringBuilder, StructBuilder,
    TimestampMicrosecondBuilder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::ArrowError;

use crate::chip::{bbox_fields, chip_schema_of, chip_schema_typed, Footprint};
use crate::embedding::{EmbeddingBuilder, EmbeddingType};
use crate::ids::Window;

type Result<T> = std::result::Result<T, ArrowError>;

/// One row of `chips/*.parquet`.
#[derive(Debug, Clone, PartialEq)]
pub struct ChipRow {
    /// See [`crate::ids::chip_id`].
    pub chip_id: String,
    /// Canonical input URL.
    pub source_uri: String,
    /// ETag or size + mtime.
    pub source_version: Option<String>,
    /// Window fed to the model.
    pub window: Window,
    /// Share of real pixels.
    pub valid_fraction: f32,
    /// Source CRS, e.g. `EPSG:32618`, when the source is georeferenced.
    pub crs: Option<String>,
    /// Footprint in lon/lat, when the chip has one.
    pub footprint: Option<Footprint>,
    /// Lon/lat of the window's centre, when it has one (a chip whose corner
    /// is off a GOES disk has a centre and no footprint).
    pub centre: Option<[f64; 2]>,
    /// L2-normalized embedding.
    pub embedding: Vec<f32>,
    /// The schema 2 columns; all null for inputs that are not STAC items.
    pub stac: StacColumns,
}

/// The columns schema 2 appended: what a STAC item says of its chips.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StacColumns {
    /// The item's `id`.
    pub item_id: Option<String>,
    /// The item's `collection`.
    pub collection: Option<String>,
    /// Acquisition time (a range's start), µs since the epoch, UTC.
    pub datetime: Option<i64>,
    /// The end of the acquisition range, µs since the epoch, UTC.
    pub end_datetime: Option<i64>,
    /// Share of the chip's valid pixels that `--cloud-mask` marks as cloud.
    pub cloud_fraction: Option<f32>,
}

impl StacColumns {
    /// The item columns of `input` (none for inputs that are not STAC items).
    pub fn of(input: &crate::task::TaskInput, cloud_fraction: Option<f32>) -> Self {
        match &input.item {
            None => StacColumns {
                cloud_fraction,
                ..Default::default()
            },
            Some(item) => StacColumns {
                item_id: Some(item.id.clone()),
                collection: item.collection.clone(),
                datetime: item.datetime,
                end_datetime: item.end_datetime,
                cloud_fraction,
            },
        }
    }
}

/// The columns schema 3 appended, besides `grid_cell` (which
/// [`chip_batch_version`] derives from the row's centre): where the row sits
/// on the CRS lattice and in time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CellColumns {
    /// `EPSG:<code>/<res>/<stride>/<col>/<row>` under `--align crs`.
    pub cell: Option<String>,
    /// The time window's start (`--windows`), µs since the epoch, UTC.
    pub window_start: Option<i64>,
    /// The time window's end (exclusive), µs since the epoch, UTC.
    pub window_end: Option<i64>,
    /// The acquisitions that covered the cell in the window.
    pub scenes: Option<i32>,
}

/// A chip row with the columns of schema 3: what a task writes.
#[derive(Debug, Clone, PartialEq)]
pub struct CellRow {
    /// The columns of schemas 1 and 2.
    pub chip: ChipRow,
    /// The columns schema 3 appended.
    pub cells: CellColumns,
}

/// A row [`chip_batch`] writes: a [`ChipRow`] (its schema 3 columns null,
/// but `grid_cell`) or a [`CellRow`].
pub trait AsChipRow {
    /// The columns of schemas 1 and 2.
    fn chip(&self) -> &ChipRow;
    /// The columns schema 3 appended, when the row has them.
    fn cells(&self) -> Option<&CellColumns> {
        None
    }
}

impl AsChipRow for ChipRow {
    fn chip(&self) -> &ChipRow {
        self
    }
}

impl AsChipRow for CellRow {
    fn chip(&self) -> &ChipRow {
        &self.chip
    }

    fn cells(&self) -> Option<&CellColumns> {
        Some(&self.cells)
    }
}

/// Builds a record batch of chip rows in the current schema version,
/// embeddings stored as `ty`; every embedding must have `embed_dim` floats.
pub fn chip_batch<R: AsChipRow>(
    rows: &[R],
    embed_dim: usize,
    ty: EmbeddingType,
) -> Result<RecordBatch> {
    chip_batch_version(rows, crate::SCHEMA_VERSION, embed_dim, ty)
}

/// Builds a record batch of chip rows in chip schema `version` (a job's
/// [`crate::job::TilingSpec::schema_version`]: 2 or 3), embeddings
/// stored as `ty`. A version without a column leaves it out whatever the
/// rows hold; `grid_cell` is the Major TOM cell of the row's centre.
pub fn chip_batch_version<R: AsChipRow>(
    rows: &[R],
    version: u32,
    embed_dim: usize,
    ty: EmbeddingType,
) -> Result<RecordBatch> {
    let schema = chip_schema_of(embed_dim, version, ty).ok_or_else(|| {
        ArrowError::SchemaError(format!(
            "chip schema version {version} is not one this rsembed writes"
        ))
    })?;
    let batch = chip_batch_all(rows, embed_dim, ty)?;
    if schema.fields().len() == batch.num_columns() {
        return Ok(batch);
    }
    // An older version: its columns, by name, in its order.
    let cols = schema
        .fields()
        .iter()
        .map(|f| {
            batch
                .column_by_name(f.name())
                .cloned()
                .expect("every version's columns are the current version's")
        })
        .collect();
    RecordBatch::try_new(schema, cols)
}

/// [`chip_batch`] in the newest schema.
fn chip_batch_all<R: AsChipRow>(
    rows: &[R],
    embed_dim: usize,
    ty: EmbeddingType,
) -> Result<RecordBatch> {
    let n = rows.len();
    let mut chip_id = StringBuilder::with_capacity(n, n * 32);
    let mut uri = StringBuilder::new();
    let mut version = StringBuilder::new();
    let mut x = Int32Builder::with_capacity(n);
    let mut y = Int32Builder::with_capacity(n);
    let mut w = Int32Builder::with_capacity(n);
    let mut h = Int32Builder::with_capacity(n);
    let mut valid = Float32Builder::with_capacity(n);
    let mut crs = StringBuilder::new();
    let mut geom = BinaryBuilder::new();
    let mut bbox = StructBuilder::from_fields(bbox_fields(), n);
    let mut lon = Float64Builder::with_capacity(n);
    let mut lat = Float64Builder::with_capacity(n);
    let mut emb = EmbeddingBuilder::new(ty, embed_dim, n);
    let mut item_id = StringBuilder::new();
    let mut collection = StringBuilder::new();
    let mut datetime = TimestampMicrosecondBuilder::with_capacity(n).with_timezone("UTC");
    let mut cloud = Float32Builder::with_capacity(n);
    let mut end_datetime = TimestampMicrosecondBuilder::with_capacity(n).with_timezone("UTC");
    let mut cell = StringBuilder::new();
    let mut grid_cell = StringBuilder::new();
    let mut window_start = TimestampMicrosecondBuilder::with_capacity(n).with_timezone("UTC");
    let mut window_end = TimestampMicrosecondBuilder::with_capacity(n).with_timezone("UTC");
    let mut scenes = Int32Builder::with_capacity(n);
    for row in rows {
        let none = CellColumns::default();
        let cells = row.cells().unwrap_or(&none);
        cell.append_option(cells.cell.as_deref());
        window_start.append_option(cells.window_start);
        window_end.append_option(cells.window_end);
        scenes.append_option(cells.scenes);
        let r = row.chip();
        grid_cell.append_option(
            r.centre
                .and_then(|[lon, lat]| crate::majortom::grid_cell(lat, lon)),
        );
        item_id.append_option(r.stac.item_id.as_deref());
        collection.append_option(r.stac.collection.as_deref());
        datetime.append_option(r.stac.datetime);
        cloud.append_option(r.stac.cloud_fraction);
        end_datetime.append_option(r.stac.end_datetime);
        assert_eq!(
            r.embedding.len(),
            embed_dim,
            "embedding of the wrong size: this is a bug"
        );
        chip_id.append_value(&r.chip_id);
        uri.append_value(&r.source_uri);
        version.append_option(r.source_version.as_deref());
        x.append_value(r.window.x);
        y.append_value(r.window.y);
        w.append_value(r.window.width);
        h.append_value(r.window.height);
        valid.append_value(r.valid_fraction);
        crs.append_option(r.crs.as_deref());
        match &r.footprint {
            Some(f) => {
                geom.append_value(&f.wkb);
                for (i, v) in f.bbox.iter().enumerate() {
                    bbox.field_builder::<Float64Builder>(i)
                        .expect("bbox has four float fields")
                        .append_value(*v);
                }
                bbox.append(true);
            }
            None => {
                geom.append_null();
                for i in 0..4 {
                    // Children of a null struct slot still need a value.
                    bbox.field_builder::<Float64Builder>(i)
                        .expect("bbox has four float fields")
                        .append_value(0.0);
                }
                bbox.append(false);
            }
        }
        lon.append_option(r.centre.map(|c| c[0]));
        lat.append_option(r.centre.map(|c| c[1]));
        emb.append(&r.embedding);
    }
    let (embedding, scale) = emb.finish();
    let mut cols: Vec<ArrayRef> = vec![
        Arc::new(chip_id.finish()),
        Arc::new(uri.finish()),
        Arc::new(version.finish()),
        Arc::new(x.finish()),
        Arc::new(y.finish()),
        Arc::new(w.finish()),
        Arc::new(h.finish()),
        Arc::new(valid.finish()),
        Arc::new(crs.finish()),
        Arc::new(geom.finish()),
        Arc::new(bbox.finish()),
        Arc::new(lon.finish()),
        Arc::new(lat.finish()),
        embedding,
        Arc::new(item_id.finish()),
        Arc::new(collection.finish()),
        Arc::new(datetime.finish()),
        Arc::new(cloud.finish()),
        Arc::new(end_datetime.finish()),
        Arc::new(cell.finish()),
        Arc::new(grid_cell.finish()),
        Arc::new(window_start.finish()),
        Arc::new(window_end.finish()),
        Arc::new(scenes.finish()),
    ];
    cols.extend(scale);
    RecordBatch::try_new(chip_schema_typed(embed_dim, ty), cols)
}

/// The lon/lat extent of the rows that have footprints.
pub fn extent<R: AsChipRow>(rows: &[R]) -> Option<[f64; 4]> {
    rows.iter()
        .filter_map(|r| r.chip().footprint.as_ref().map(|f| f.bbox))
        .reduce(|a, b| {
            [
                a[0].min(b[0]),
                a[1].min(b[1]),
                a[2].max(b[2]),
                a[3].max(b[3]),
            ]
        })
}

#[cfg(test)]
mod tests {
    use arrow_array::cast::AsArray;
    use arrow_array::Array;

    use super::*;

    fn row(i: i32, fp: bool) -> ChipRow {
        ChipRow {
            chip_id: format!("{i:032x}"),
            source_uri: format!("file:///x/{i}.png"),
            source_version: Some("1-2".into()),
            window: Window {
                x: 0,
                y: 0,
                width: 8,
                height: 8,
            },
            valid_fraction: 1.0,
            crs: fp.then(|| "EPSG:4326".into()),
            footprint: fp.then(|| Footprint {
                wkb: vec![1, 3, 0, 0, 0],
                bbox: [i as f64, 0.0, i as f64 + 1.0, 1.0],
            }),
            centre: fp.then_some([i as f64 + 0.5, 0.5]),
            embedding: vec![0.5; 4],
            stac: Default::default(),
        }
    }

    #[test]
    fn builds_batch_with_nulls_for_plain_images() {
        let b = chip_batch(&[row(1, false), row(2, true)], 4, EmbeddingType::F32).unwrap();
        assert_eq!(b.num_rows(), 2);
        assert!(b.column_by_name("geometry").unwrap().is_null(0));
        assert!(!b.column_by_name("geometry").unwrap().is_null(1));
        assert!(b.column_by_name("bbox").unwrap().is_null(0));
        assert_eq!(
            extent(&[row(1, true), row(3, true)]),
            Some([1.0, 0.0, 4.0, 1.0])
        );
        assert_eq!(extent(&[row(1, false)]), None);
    }

    #[test]
    fn a_centre_without_a_footprint_is_written() {
        // A GOES chip at the disk's edge: a corner in space, its centre on Earth.
        let edge = ChipRow {
            centre: Some([-75.0, 1.5]),
            ..row(1, false)
        };
        let b = chip_batch(&[edge, row(2, false)], 4, EmbeddingType::F32).unwrap();
        assert!(b.column_by_name("geometry").unwrap().is_null(0));
        let lon = b
            .column_by_name("centre_lon")
            .unwrap()
            .as_primitive::<arrow_array::types::Float64Type>();
        let lat = b
            .column_by_name("centre_lat")
            .unwrap()
            .as_primitive::<arrow_array::types::Float64Type>();
        assert_eq!((lon.value(0), lat.value(0)), (-75.0, 1.5));
        assert!(lon.is_null(1) && lat.is_null(1));
    }

    #[test]
    fn a_job_writes_the_columns_of_its_schema_version() {
        use arrow_array::cast::AsArray;
        let mut r = row(1, true);
        r.centre = Some([2.35, 48.85]);
        let rows = vec![
            CellRow {
                chip: r,
                cells: CellColumns {
                    cell: Some("EPSG:32631/10/256/175/-2100".into()),
                    window_start: Some(1_704_067_200_000_000),
                    window_end: Some(1_711_929_600_000_000),
                    scenes: Some(3),
                },
            },
            CellRow {
                chip: row(2, false),
                cells: CellColumns::default(),
            },
        ];
        let v3 = chip_batch_version(&rows, 3, 4, EmbeddingType::F32).unwrap();
        assert_eq!(v3.schema(), chip_schema_typed(4, EmbeddingType::F32));
        let text = |b: &RecordBatch, c: &str| {
            let a = b.column_by_name(c).unwrap().as_string::<i32>().clone();
            (0..a.len())
                .map(|i| a.is_valid(i).then(|| a.value(i).to_owned()))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            text(&v3, "cell"),
            [Some("EPSG:32631/10/256/175/-2100".to_owned()), None]
        );
        let paris = crate::majortom::grid_cell(48.85, 2.35);
        assert!(paris.is_some());
        assert_eq!(text(&v3, "grid_cell"), [paris, None], "no centre, no cell");
        let scenes = v3
            .column_by_name("scenes")
            .unwrap()
            .as_primitive::<arrow_array::types::Int32Type>();
        assert_eq!((scenes.value(0), scenes.is_null(1)), (3, true));
        // A version 2 job's files have none of them; int8 keeps its scale last.
        let v2 = chip_batch_version(&rows, 2, 4, EmbeddingType::Int8).unwrap();
        assert_eq!(
            v2.schema(),
            chip_schema_of(4, 2, EmbeddingType::Int8).unwrap()
        );
        assert!(v2.column_by_name("cell").is_none());
        assert_eq!(
            v2.schema().fields().last().unwrap().name(),
            "embedding_scale"
        );
        assert!(chip_batch_version(&rows, 9, 4, EmbeddingType::F32).is_err());
        // Plain rows: the schema 3 columns are null but grid_cell.
        let plain = chip_batch(&[rows[0].chip.clone()], 4, EmbeddingType::F32).unwrap();
        assert!(plain.column_by_name("cell").unwrap().is_null(0));
        assert!(!plain.column_by_name("grid_cell").unwrap().is_null(0));
    }

    #[test]
    fn empty_batches_are_valid() {
        assert_eq!(
            chip_batch::<ChipRow>(&[], 4, EmbeddingType::F32)
                .unwrap()
                .num_rows(),
            0
        );
    }
}
