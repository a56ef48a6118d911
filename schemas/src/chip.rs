//! Arrow schemas of the rows rsembed writes: `chips/*.parquet` and `errors/*.parquet`.

#[cfg(feature = "arrow")]
use std::sync::Arc;

#[cfg(feature = "arrow")]
use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef};

/// Column names of the chip schema, in file order.
pub mod col {
    /// Stable chip identity, 32 hex chars.
    pub const CHIP_ID: &str = "chip_id";
    /// Canonical URL of the input.
    pub const SOURCE_URI: &str = "source_uri";
    /// ETag, or size + modification time.
    pub const SOURCE_VERSION: &str = "source_version";
    /// Window origin, column.
    pub const X: &str = "x";
    /// Window origin, row.
    pub const Y: &str = "y";
    /// Window width in source pixels.
    pub const WIDTH: &str = "width";
    /// Window height in source pixels.
    pub const HEIGHT: &str = "height";
    /// Share of real, non-nodata pixels.
    pub const VALID_FRACTION: &str = "valid_fraction";
    /// Source CRS.
    pub const CRS: &str = "crs";
    /// WKB footprint in OGC:CRS84.
    pub const GEOMETRY: &str = "geometry";
    /// GeoParquet 1.1 bbox covering.
    pub const BBOX: &str = "bbox";
    /// Centre longitude.
    pub const CENTRE_LON: &str = "centre_lon";
    /// Centre latitude.
    pub const CENTRE_LAT: &str = "centre_lat";
    /// L2-normalized embedding.
    pub const EMBEDDING: &str = "embedding";
    /// Schema 2: the STAC item's `id`; null for inputs that are not STAC items.
    pub const ITEM_ID: &str = "item_id";
    /// Schema 2: the STAC item's `collection`.
    pub const COLLECTION: &str = "collection";
    /// Schema 2: acquisition time, UTC (a range's start).
    pub const DATETIME: &str = "datetime";
    /// Schema 2: share of the chip's valid pixels the `--cloud-mask` marks as cloud.
    pub const CLOUD_FRACTION: &str = "cloud_fraction";
    /// Schema 2: the end of the acquisition range, for items that give one.
    pub const END_DATETIME: &str = "end_datetime";
    /// Schema 3: the chip's cell of the CRS lattice (`--align crs`),
    /// `EPSG:<code>/<res>/<stride>/<col>/<row>`; null under `--align scene`.
    pub const CELL: &str = "cell";
    /// Schema 3: the Major TOM 10 km cell holding the chip's centre
    /// (`434U_876L`); null when the chip has no centre lon/lat.
    pub const GRID_CELL: &str = "grid_cell";
    /// Schema 3: the start of the row's time window (`--windows`), UTC.
    pub const WINDOW_START: &str = "window_start";
    /// Schema 3: the end of the row's time window (exclusive), UTC.
    pub const WINDOW_END: &str = "window_end";
    /// Schema 3: the acquisitions that covered the cell in the window.
    pub const SCENES: &str = "scenes";
}

/// Columns of chip schema version 1.
pub const V1_COLUMNS: usize = 14;
/// Columns of chip schema version 2: version 1's, then five STAC columns.
pub const V2_COLUMNS: usize = 19;
/// Columns of chip schema version 3: version 2's, then five grid and window
/// columns.
pub const V3_COLUMNS: usize = 24;

/// The chip schema versions rsembed reads, newest first.
pub const SCHEMA_VERSIONS: [u32; 3] = [3, 2, 1];

/// Where a chip lies on Earth: a chip's outline, as its row stores it.
///
/// Absent (`None` where it is held) for images without georeferencing and
/// for chips whose outline leaves the projection's domain. The window's
/// centre is apart (`Projector::centre` in rsembed-raster): a GOES chip at the disk's edge
/// has one even when a corner is in space.
#[derive(Debug, Clone, PartialEq)]
pub struct Footprint {
    /// WKB Polygon (little-endian, 2D), closed counter-clockwise ring, lon/lat.
    pub wkb: Vec<u8>,
    /// Bounding box of the ring: xmin, ymin, xmax, ymax (lon/lat).
    pub bbox: [f64; 4],
}

/// The Arrow type of `datetime` and `end_datetime`.
#[cfg(feature = "arrow")]
pub fn timestamp_type() -> DataType {
    DataType::Timestamp(arrow_schema::TimeUnit::Microsecond, Some("UTC".into()))
}

/// Fields of the `bbox` struct column, in GeoParquet covering order.
#[cfg(feature = "arrow")]
pub fn bbox_fields() -> Fields {
    Fields::from(vec![
        Field::new("xmin", DataType::Float64, false),
        Field::new("ymin", DataType::Float64, false),
        Field::new("xmax", DataType::Float64, false),
        Field::new("ymax", DataType::Float64, false),
    ])
}

/// The Arrow type of the embedding column for dimension `embed_dim`.
#[cfg(feature = "arrow")]
pub fn embedding_type(embed_dim: usize) -> DataType {
    DataType::FixedSizeList(
        Arc::new(Field::new("item", DataType::Float32, false)),
        i32::try_from(embed_dim).expect("embedding dimension fits in i32"),
    )
}

/// The Arrow type of the embedding column stored as `ty`.
#[cfg(feature = "arrow")]
pub fn embedding_type_of(embed_dim: usize, ty: crate::embedding::EmbeddingType) -> DataType {
    ty.arrow_type(embed_dim)
}

/// `schema` (a chip schema of float32 embeddings, any version) with its
/// embedding stored as `ty`: the column's type changes, and int8 appends the
/// not-null Float32 `embedding_scale` after every other column, so that
/// readers of the columns by position still find them where they were.
#[cfg(feature = "arrow")]
pub fn with_embedding_type(
    schema: &Schema,
    embed_dim: usize,
    ty: crate::embedding::EmbeddingType,
) -> SchemaRef {
    let mut fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| {
            if f.name() == col::EMBEDDING {
                f.as_ref()
                    .clone()
                    .with_data_type(embedding_type_of(embed_dim, ty))
            } else {
                f.as_ref().clone()
            }
        })
        .collect();
    if ty == crate::embedding::EmbeddingType::Int8 {
        fields.push(Field::new(
            crate::embedding::SCALE_COLUMN,
            DataType::Float32,
            false,
        ));
    }
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// The stored type and dimension of an `embedding` column of Arrow type `t`;
/// `None` for any other type.
#[cfg(feature = "arrow")]
pub fn embedding_type_from(t: &DataType) -> Option<(crate::embedding::EmbeddingType, usize)> {
    use crate::embedding::EmbeddingType;
    let DataType::FixedSizeList(item, d) = t else {
        return None;
    };
    let ty = match item.data_type() {
        DataType::Float32 => EmbeddingType::F32,
        DataType::Float16 => EmbeddingType::F16,
        DataType::Int8 => EmbeddingType::Int8,
        _ => return None,
    };
    Some((ty, usize::try_from(*d).ok().filter(|&d| d > 0)?))
}

/// The chip row schema of embeddings stored as `ty`, version
/// [`crate::SCHEMA_VERSION`].
#[cfg(feature = "arrow")]
pub fn chip_schema_typed(embed_dim: usize, ty: crate::embedding::EmbeddingType) -> SchemaRef {
    chip_schema_of(embed_dim, crate::SCHEMA_VERSION, ty).expect("the current version is known")
}

/// The chip row schema of `version` (1, 2 or 3) with embeddings stored as
/// `ty`; `None` for a version rsembed does not know. Each version's columns
/// are the previous version's with its own appended, so a reader by
/// position of an older version still finds its columns (int8's
/// `embedding_scale` comes last in every version).
#[cfg(feature = "arrow")]
pub fn chip_schema_of(
    embed_dim: usize,
    version: u32,
    ty: crate::embedding::EmbeddingType,
) -> Option<SchemaRef> {
    let n = match version {
        1 => V1_COLUMNS,
        2 => V2_COLUMNS,
        3 => V3_COLUMNS,
        _ => return None,
    };
    let all = chip_schema(embed_dim);
    let base = if n == all.fields().len() {
        all
    } else {
        Arc::new(Schema::new(all.fields()[..n].to_vec()))
    };
    Some(if ty.is_f32() {
        base
    } else {
        with_embedding_type(&base, embed_dim, ty)
    })
}

/// The chip row schema, version [`crate::SCHEMA_VERSION`], float32 embeddings.
#[cfg(feature = "arrow")]
pub fn chip_schema(embed_dim: usize) -> SchemaRef {
    use col::*;
    Arc::new(Schema::new(vec![
        Field::new(CHIP_ID, DataType::Utf8, false),
        Field::new(SOURCE_URI, DataType::Utf8, false),
        Field::new(SOURCE_VERSION, DataType::Utf8, true),
        Field::new(X, DataType::Int32, false),
        Field::new(Y, DataType::Int32, false),
        Field::new(WIDTH, DataType::Int32, false),
        Field::new(HEIGHT, DataType::Int32, false),
        Field::new(VALID_FRACTION, DataType::Float32, false),
        Field::new(CRS, DataType::Utf8, true),
        Field::new(GEOMETRY, DataType::Binary, true),
        Field::new(BBOX, DataType::Struct(bbox_fields()), true),
        Field::new(CENTRE_LON, DataType::Float64, true),
        Field::new(CENTRE_LAT, DataType::Float64, true),
        Field::new(EMBEDDING, embedding_type(embed_dim), false),
        // Schema 2, appended so that readers of schema 1 by position still work.
        Field::new(ITEM_ID, DataType::Utf8, true),
        Field::new(COLLECTION, DataType::Utf8, true),
        Field::new(DATETIME, timestamp_type(), true),
        Field::new(CLOUD_FRACTION, DataType::Float32, true),
        Field::new(END_DATETIME, timestamp_type(), true),
        // Schema 3, appended likewise.
        Field::new(CELL, DataType::Utf8, true),
        Field::new(GRID_CELL, DataType::Utf8, true),
        Field::new(WINDOW_START, timestamp_type(), true),
        Field::new(WINDOW_END, timestamp_type(), true),
        Field::new(SCENES, DataType::Int32, true),
    ]))
}

/// Column names of the error schema.
pub mod error_col {
    /// The input that failed.
    pub const SOURCE_URI: &str = "source_uri";
    /// The pipeline stage that failed: see [`super::ErrorStage`].
    pub const STAGE: &str = "stage";
    /// Human-readable reason, with its source chain.
    pub const ERROR: &str = "error";
}

/// The schema of `errors/*.parquet`.
#[cfg(feature = "arrow")]
pub fn error_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new(error_col::SOURCE_URI, DataType::Utf8, false),
        Field::new(error_col::STAGE, DataType::Utf8, false),
        Field::new(error_col::ERROR, DataType::Utf8, false),
    ]))
}

/// Where in the pipeline an input failed; written as the `stage` column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorStage {
    /// Reading bytes from storage.
    Fetch,
    /// Decoding the file format.
    Decode,
    /// Resizing and normalizing.
    Preprocess,
    /// Running the model.
    Inference,
}

impl ErrorStage {
    /// The value written in the `stage` column.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorStage::Fetch => "fetch",
            ErrorStage::Decode => "decode",
            ErrorStage::Preprocess => "preprocess",
            ErrorStage::Inference => "inference",
        }
    }
}

#[cfg(all(test, feature = "arrow"))]
mod tests {
    use super::*;

    #[test]
    fn chip_schema_matches_design_order() {
        let schema = chip_schema(768);
        let names: Vec<_> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(
            names,
            [
                "chip_id",
                "source_uri",
                "source_version",
                "x",
                "y",
                "width",
                "height",
                "valid_fraction",
                "crs",
                "geometry",
                "bbox",
                "centre_lon",
                "centre_lat",
                "embedding",
                "item_id",
                "collection",
                "datetime",
                "cloud_fraction",
                "end_datetime",
                "cell",
                "grid_cell",
                "window_start",
                "window_end",
                "scenes"
            ]
        );
        assert_eq!(names.len(), V3_COLUMNS);
        assert_eq!(
            schema.field_with_name("embedding").unwrap().data_type(),
            &embedding_type(768)
        );
        assert!(!schema.field_with_name("chip_id").unwrap().is_nullable());
        assert!(schema.field_with_name("geometry").unwrap().is_nullable());
    }

    #[test]
    fn int8_appends_its_scale_and_keeps_positions() {
        use crate::embedding::EmbeddingType;
        let f32s = chip_schema(8);
        let i8s = chip_schema_typed(8, EmbeddingType::Int8);
        assert_eq!(i8s.fields().len(), f32s.fields().len() + 1);
        assert_eq!(i8s.field(i8s.fields().len() - 1).name(), "embedding_scale");
        let e = f32s.index_of("embedding").unwrap();
        assert_eq!(i8s.index_of("embedding").unwrap(), e);
        assert_eq!(
            i8s.field(e).data_type(),
            &embedding_type_of(8, EmbeddingType::Int8)
        );
        let f16s = chip_schema_typed(8, EmbeddingType::F16);
        assert_eq!(f16s.fields().len(), f32s.fields().len());
        assert_eq!(chip_schema_typed(8, EmbeddingType::F32), f32s);
    }

    #[test]
    fn each_version_is_the_one_before_with_its_columns_appended() {
        use crate::embedding::EmbeddingType;
        let names = |v: u32, t: EmbeddingType| -> Vec<String> {
            chip_schema_of(8, v, t)
                .unwrap()
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect()
        };
        let (v1, v2, v3) = (
            names(1, EmbeddingType::F32),
            names(2, EmbeddingType::F32),
            names(3, EmbeddingType::F32),
        );
        assert_eq!((v1.len(), v2.len(), v3.len()), (14, 19, 24));
        assert_eq!(v2[..14], v1[..]);
        assert_eq!(v3[..19], v2[..]);
        assert_eq!(v1.last().unwrap(), "embedding");
        assert_eq!(v2.last().unwrap(), "end_datetime");
        assert_eq!(
            chip_schema_of(8, crate::SCHEMA_VERSION, EmbeddingType::F32).unwrap(),
            chip_schema(8)
        );
        for v in SCHEMA_VERSIONS {
            let i8s = names(v, EmbeddingType::Int8);
            assert_eq!(i8s.last().unwrap(), "embedding_scale", "{v}");
            assert_eq!(i8s.len(), names(v, EmbeddingType::F32).len() + 1);
        }
        assert!(chip_schema_of(8, 4, EmbeddingType::F32).is_none());
        assert!(chip_schema_of(8, 0, EmbeddingType::F32).is_none());
        let s = chip_schema(8);
        for c in [
            col::CELL,
            col::GRID_CELL,
            col::WINDOW_START,
            col::WINDOW_END,
            col::SCENES,
        ] {
            assert!(s.field_with_name(c).unwrap().is_nullable(), "{c}");
        }
    }
}
