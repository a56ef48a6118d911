//! The second pass of a search: the winners' columns, read in place from
//! their chunks where they can be, and the results built from them.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::{
    Array, BinaryArray, Float32Array, Float64Array, Int32Array, RecordBatch, StringArray,
    TimestampMicrosecondArray,
};
use futures::StreamExt;
use rsembed_schemas::chip::col;

use parquet::column::page::Page;

use super::SearchResult;
use crate::format::answer;
use crate::format::index::{GroupRef, Index};
use crate::format::pages::Chunk;
use crate::kernels::Hit;
use crate::scan::selection_of;
use crate::{Error as QueryError, Result};

/// Reads the winners' columns (only their rows) and builds the results.
pub(super) async fn details(
    index: &Index,
    hits: &[Hit],
    scale_bias: Option<(f64, f64)>,
    concurrency: usize,
    mut ahead: BTreeMap<GroupRef, tokio::task::JoinHandle<Ahead>>,
) -> Result<Vec<SearchResult>> {
    let mut by_group: BTreeMap<GroupRef, Vec<usize>> = BTreeMap::new();
    for h in hits {
        by_group.entry(h.group).or_default().push(h.row);
    }
    let by_group: Vec<_> = by_group
        .into_iter()
        .map(|(g, wanted)| (g, wanted, ahead.remove(&g)))
        .collect();
    // Read ahead for groups that hold no hit: not needed.
    for h in ahead.values() {
        h.abort();
    }
    // The groups are read side by side: on an object store each is a round
    // trip, and ten hits in ten groups read one after another were ten.
    let mut reads = futures::stream::iter(by_group)
        .map(|(g, wanted, ahead)| group_details(index, g, wanted, ahead))
        .buffer_unordered(concurrency.max(1));
    let mut rows: BTreeMap<(GroupRef, usize), SearchResult> = BTreeMap::new();
    while let Some(read) = reads.next().await {
        rows.extend(read?);
    }
    // Each row is taken at its last use and cloned before: in a batch,
    // queries share rows, and a copy of every row would double the peak.
    let mut uses: BTreeMap<(GroupRef, usize), usize> = BTreeMap::new();
    for h in hits {
        *uses.entry((h.group, h.row)).or_default() += 1;
    }
    hits.iter()
        .enumerate()
        .map(|(rank, h)| {
            let key = (h.group, h.row);
            let left = uses.get_mut(&key).map(|n| {
                *n -= 1;
                *n
            });
            let found = match left {
                Some(0) => rows.remove(&key),
                _ => rows.get(&key).cloned(),
            };
            let mut r = found.ok_or_else(|| {
                QueryError::dataset(
                    &index.parts[h.group.part].uri,
                    format!(
                        "row {} of row group {} could not be read back",
                        h.row, h.group.row_group
                    ),
                )
            })?;
            r.rank = rank + 1;
            r.cosine = h.cosine;
            r.score = scale_bias.map(|(s, b)| crate::kernels::sigmoid_score(h.cosine, s, b));
            Ok(r)
        })
        .collect()
}

/// The columns of a result, of every chip file.
pub(super) const ANSWER_BASE: [&str; 11] = [
    col::CHIP_ID,
    col::SOURCE_URI,
    col::X,
    col::Y,
    col::WIDTH,
    col::HEIGHT,
    col::VALID_FRACTION,
    col::CRS,
    col::CENTRE_LON,
    col::CENTRE_LAT,
    col::GEOMETRY,
];

/// The columns of a result schema version 2 appended, where a file has them.
pub(super) const ANSWER_STAC: [&str; 5] = [
    col::ITEM_ID,
    col::COLLECTION,
    col::DATETIME,
    col::END_DATETIME,
    col::CLOUD_FRACTION,
];

/// The columns of a result schema version 3 appended, where a file has them.
pub(super) const ANSWER_CELLS: [&str; 4] = [
    col::CELL,
    col::GRID_CELL,
    col::WINDOW_START,
    col::WINDOW_END,
];

/// The answer columns of a part: those of every chip file, and those of
/// schema versions 2 and 3 it has.
pub(super) fn answer_columns(part: &crate::format::index::Part) -> Vec<&'static str> {
    ANSWER_BASE
        .iter()
        .chain(
            ANSWER_STAC
                .iter()
                .chain(&ANSWER_CELLS)
                .filter(|c| part.has_column(c)),
        )
        .copied()
        .collect()
}

/// A row group's answer columns fetched ahead of its hits, with every page
/// of them inflated where they all inflate; `None` where the in-place reader
/// does not take them or the fetch failed (the group's answer is then read
/// as any other's, which reports the failure).
pub(super) type Ahead = Option<(Vec<Chunk>, Option<Vec<Vec<Page>>>)>;

/// Most row groups a single query reads ahead the answer columns of: a
/// query that scores fewer groups than there are cores leaves a core idle
/// while it scores, and its hits are in those groups.
pub(super) fn read_ahead_groups() -> usize {
    // Asked once: `available_parallelism` reads the cgroup's files each call.
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get())) - 1
}

/// [`Ahead`] for row group `g`.
pub(super) async fn read_ahead(index: Arc<Index>, g: GroupRef) -> Ahead {
    let columns = answer_columns(&index.parts[g.part]);
    let chunks = answer_chunks(&index, g, &columns).await.ok()??;
    let pages = chunks
        .iter()
        .map(answer::inflate)
        .collect::<std::result::Result<Vec<_>, _>>()
        .ok();
    Some((chunks, pages))
}

/// The chunks of the answer `columns` of row group `g` for the in-place
/// reader ([`answer_rows`]); `None` where it does not take them.
pub(super) async fn answer_chunks(
    index: &Index,
    g: GroupRef,
    columns: &[&str],
) -> Result<Option<Vec<Chunk>>> {
    let part = &index.parts[g.part];
    if !columns.iter().all(|c| answer_type_ok(part, c)) {
        return Ok(None);
    }
    Ok(match index.flat_chunks(g, columns).await? {
        Ok(chunks) => Some(chunks),
        Err(why) => {
            tracing::debug!(uri = %part.uri, %why, "answer read by the arrow reader");
            None
        }
    })
}

/// The answer columns of rows `wanted` of row group `g`, from `ahead` when
/// they were read ahead.
pub(super) async fn group_details(
    index: &Index,
    g: GroupRef,
    mut wanted: Vec<usize>,
    ahead: Option<tokio::task::JoinHandle<Ahead>>,
) -> Result<Vec<((GroupRef, usize), SearchResult)>> {
    let mut rows = Vec::with_capacity(wanted.len());
    wanted.sort_unstable();
    wanted.dedup();
    let part = &index.parts[g.part];
    let sel = selection_of(&wanted, part.group_rows(g.row_group));
    let tiling = part.file_meta.as_ref().map(|m| Arc::new(m.tiling.clone()));
    let columns = answer_columns(part);
    let ahead = match ahead {
        Some(h) => h.await.ok().flatten(),
        None => None,
    };
    let chunks = match ahead {
        Some(read) => Some(read),
        None => answer_chunks(index, g, &columns).await?.map(|c| (c, None)),
    };
    if let Some((chunks, pages)) = chunks {
        match answer_rows(g, &wanted, &columns, (&chunks, pages.as_deref()), &tiling) {
            Ok(rows) => return Ok(rows),
            Err(why) => tracing::debug!(uri = %part.uri, %why, "answer read by the arrow reader"),
        }
    }
    let mut s = index.stream(g, &columns, Some(sel)).await?;
    let mut next = wanted.iter();
    while let Some(batch) = s.next().await {
        let uri = &index.parts[g.part].uri;
        let batch = batch.map_err(|source| QueryError::Read {
            uri: uri.clone(),
            source,
        })?;
        let ids = string_col(&batch, col::CHIP_ID, uri)?;
        let uris = string_col(&batch, col::SOURCE_URI, uri)?;
        let crs = string_col(&batch, col::CRS, uri)?;
        let ints = |name: &str| -> Result<&Int32Array> {
            batch
                .column_by_name(name)
                .and_then(|c| c.as_any().downcast_ref::<Int32Array>())
                .ok_or_else(|| QueryError::column(uri, name, "int32"))
        };
        let (x, y, w, h) = (
            ints(col::X)?,
            ints(col::Y)?,
            ints(col::WIDTH)?,
            ints(col::HEIGHT)?,
        );
        let valid = batch
            .column_by_name(col::VALID_FRACTION)
            .and_then(|c| c.as_any().downcast_ref::<Float32Array>())
            .ok_or_else(|| QueryError::column(uri, col::VALID_FRACTION, "float32"))?;
        let f64s = |name: &str| -> Result<&Float64Array> {
            batch
                .column_by_name(name)
                .and_then(|c| c.as_any().downcast_ref::<Float64Array>())
                .ok_or_else(|| QueryError::column(uri, name, "float64"))
        };
        let (lon, lat) = (f64s(col::CENTRE_LON)?, f64s(col::CENTRE_LAT)?);
        let geom = batch
            .column_by_name(col::GEOMETRY)
            .and_then(|c| c.as_any().downcast_ref::<BinaryArray>())
            .ok_or_else(|| QueryError::column(uri, col::GEOMETRY, "binary"))?;
        let st = StacCols::of(&batch, uri)?;
        for i in 0..batch.num_rows() {
            let Some(&row) = next.next() else { break };
            let opt_f = |a: &Float64Array| a.is_valid(i).then(|| a.value(i));
            rows.push((
                (g, row),
                SearchResult {
                    query: None,
                    rank: 0,
                    score: None,
                    cosine: 0.0,
                    chip_id: ids.value(i).to_owned(),
                    source_uri: uris.value(i).to_owned(),
                    x: x.value(i),
                    y: y.value(i),
                    width: w.value(i),
                    height: h.value(i),
                    valid_fraction: valid.value(i),
                    crs: crs.is_valid(i).then(|| crs.value(i).to_owned()),
                    centre_lon: opt_f(lon),
                    centre_lat: opt_f(lat),
                    item_id: st.item_id.and_then(|a| opt_str(a, i)),
                    collection: st.collection.and_then(|a| opt_str(a, i)),
                    datetime: st.datetime.and_then(|a| opt_time(a, i)),
                    end_datetime: st.end_datetime.and_then(|a| opt_time(a, i)),
                    cloud_fraction: st
                        .cloud_fraction
                        .and_then(|a| a.is_valid(i).then(|| a.value(i))),
                    cell: st.cell.and_then(|a| opt_str(a, i)),
                    grid_cell: st.grid_cell.and_then(|a| opt_str(a, i)),
                    window_start: st.window_start.and_then(|a| opt_time(a, i)),
                    window_end: st.window_end.and_then(|a| opt_time(a, i)),
                    wkb: geom.is_valid(i).then(|| geom.value(i).to_vec()),
                    tiling: tiling.clone(),
                },
            ));
        }
    }
    Ok(rows)
}

/// A result read back, at its place.
type Found = ((GroupRef, usize), SearchResult);

/// Whether column `name` of `part` has the arrow type [`answer_rows`] reads.
pub(super) fn answer_type_ok(part: &crate::format::index::Part, name: &str) -> bool {
    use arrow_schema::{DataType, TimeUnit};
    let Ok(f) = part.schema.field_with_name(name) else {
        return false;
    };
    let want = match name {
        col::X | col::Y | col::WIDTH | col::HEIGHT => DataType::Int32,
        col::VALID_FRACTION | col::CLOUD_FRACTION => DataType::Float32,
        col::CENTRE_LON | col::CENTRE_LAT => DataType::Float64,
        col::GEOMETRY => DataType::Binary,
        col::DATETIME | col::END_DATETIME | col::WINDOW_START | col::WINDOW_END => {
            return matches!(f.data_type(), DataType::Timestamp(TimeUnit::Microsecond, _));
        }
        _ => DataType::Utf8,
    };
    *f.data_type() == want
}

/// The results of rows `wanted` of row group `g` from its answer columns'
/// chunks (`columns[i]` in `chunks[i]`), read by [`crate::format::answer`];
/// `Err` with the reason where that reader does not take them.
pub(super) fn answer_rows(
    g: GroupRef,
    wanted: &[usize],
    columns: &[&str],
    (chunks, inflated): (&[Chunk], Option<&[Vec<Page>]>),
    tiling: &Option<Arc<rsembed_schemas::job::TilingSpec>>,
) -> std::result::Result<Vec<Found>, String> {
    use parquet::data_type::{ByteArrayType, DoubleType, FloatType, Int32Type, Int64Type};
    let chunk = |name: &str| {
        columns
            .iter()
            .position(|c| *c == name)
            .map(|i| (&chunks[i], inflated.map(|p| p[i].clone())))
    };
    let need = |name: &str| chunk(name).ok_or_else(|| format!("no {name}"));
    let bytes = |name: &str| -> std::result::Result<Vec<Option<Vec<u8>>>, String> {
        let Some((c, pages)) = chunk(name) else {
            return Ok(vec![None; wanted.len()]);
        };
        Ok(answer::column::<ByteArrayType>(c, wanted, pages)?
            .into_iter()
            .map(|v| v.map(|b| b.data().to_vec()))
            .collect())
    };
    let strs = |name: &str| -> std::result::Result<Vec<Option<String>>, String> {
        bytes(name)?
            .into_iter()
            .map(|v| {
                v.map(|b| String::from_utf8(b).map_err(|_| format!("{name}: not UTF-8")))
                    .transpose()
            })
            .collect()
    };
    let ints = |name: &str| {
        let (c, pages) = need(name)?;
        answer::column::<Int32Type>(c, wanted, pages)
    };
    let f64s = |name: &str| {
        let (c, pages) = need(name)?;
        answer::column::<DoubleType>(c, wanted, pages)
    };
    let f32s = |name: &str| -> std::result::Result<Vec<Option<f32>>, String> {
        chunk(name).map_or(Ok(vec![None; wanted.len()]), |(c, pages)| {
            answer::column::<FloatType>(c, wanted, pages)
        })
    };
    let times = |name: &str| -> std::result::Result<Vec<Option<i64>>, String> {
        chunk(name).map_or(Ok(vec![None; wanted.len()]), |(c, pages)| {
            answer::column::<Int64Type>(c, wanted, pages)
        })
    };
    let (ids, uris, crs) = (strs(col::CHIP_ID)?, strs(col::SOURCE_URI)?, strs(col::CRS)?);
    let (x, y) = (ints(col::X)?, ints(col::Y)?);
    let (w, h) = (ints(col::WIDTH)?, ints(col::HEIGHT)?);
    let valid = f32s(col::VALID_FRACTION)?;
    let (lon, lat) = (f64s(col::CENTRE_LON)?, f64s(col::CENTRE_LAT)?);
    let geom = bytes(col::GEOMETRY)?;
    let (item, collection) = (strs(col::ITEM_ID)?, strs(col::COLLECTION)?);
    let (start, end) = (times(col::DATETIME)?, times(col::END_DATETIME)?);
    let cloud = f32s(col::CLOUD_FRACTION)?;
    let (cell, grid) = (strs(col::CELL)?, strs(col::GRID_CELL)?);
    let (w_start, w_end) = (times(col::WINDOW_START)?, times(col::WINDOW_END)?);
    let mut cell = cell.into_iter();
    let mut grid = grid.into_iter();
    let mut ids = ids.into_iter();
    let mut uris = uris.into_iter();
    let mut crs = crs.into_iter();
    let mut item = item.into_iter();
    let mut collection = collection.into_iter();
    let mut geom = geom.into_iter();
    Ok(wanted
        .iter()
        .enumerate()
        .map(|(i, &row)| {
            (
                (g, row),
                SearchResult {
                    query: None,
                    rank: 0,
                    score: None,
                    cosine: 0.0,
                    chip_id: ids.next().flatten().unwrap_or_default(),
                    source_uri: uris.next().flatten().unwrap_or_default(),
                    x: x[i].unwrap_or_default(),
                    y: y[i].unwrap_or_default(),
                    width: w[i].unwrap_or_default(),
                    height: h[i].unwrap_or_default(),
                    valid_fraction: valid[i].unwrap_or_default(),
                    crs: crs.next().flatten(),
                    centre_lon: lon[i],
                    centre_lat: lat[i],
                    item_id: item.next().flatten(),
                    collection: collection.next().flatten(),
                    datetime: start[i].and_then(rfc3339),
                    end_datetime: end[i].and_then(rfc3339),
                    cloud_fraction: cloud[i],
                    cell: cell.next().flatten(),
                    grid_cell: grid.next().flatten(),
                    window_start: w_start[i].and_then(rfc3339),
                    window_end: w_end[i].and_then(rfc3339),
                    wkb: geom.next().flatten(),
                    tiling: tiling.clone(),
                },
            )
        })
        .collect())
}

/// The columns schema versions 2 and 3 appended, those a batch has.
pub(super) struct StacCols<'a> {
    cell: Option<&'a StringArray>,
    grid_cell: Option<&'a StringArray>,
    window_start: Option<&'a TimestampMicrosecondArray>,
    window_end: Option<&'a TimestampMicrosecondArray>,
    item_id: Option<&'a StringArray>,
    collection: Option<&'a StringArray>,
    datetime: Option<&'a TimestampMicrosecondArray>,
    end_datetime: Option<&'a TimestampMicrosecondArray>,
    cloud_fraction: Option<&'a Float32Array>,
}

impl<'a> StacCols<'a> {
    fn of(batch: &'a RecordBatch, uri: &str) -> Result<StacCols<'a>> {
        fn get<'a, T: 'static>(
            batch: &'a RecordBatch,
            name: &str,
            uri: &str,
            expected: &'static str,
        ) -> Result<Option<&'a T>> {
            match batch.column_by_name(name) {
                None => Ok(None),
                Some(c) => Ok(Some(
                    c.as_any()
                        .downcast_ref::<T>()
                        .ok_or_else(|| QueryError::column(uri, name, expected))?,
                )),
            }
        }
        Ok(StacCols {
            cell: get(batch, col::CELL, uri, "a string column")?,
            grid_cell: get(batch, col::GRID_CELL, uri, "a string column")?,
            window_start: get(batch, col::WINDOW_START, uri, "timestamp[µs, UTC]")?,
            window_end: get(batch, col::WINDOW_END, uri, "timestamp[µs, UTC]")?,
            item_id: get(batch, col::ITEM_ID, uri, "a string column")?,
            collection: get(batch, col::COLLECTION, uri, "a string column")?,
            datetime: get(batch, col::DATETIME, uri, "timestamp[µs, UTC]")?,
            end_datetime: get(batch, col::END_DATETIME, uri, "timestamp[µs, UTC]")?,
            cloud_fraction: get(batch, col::CLOUD_FRACTION, uri, "float32")?,
        })
    }
}

pub(super) fn opt_str(a: &StringArray, i: usize) -> Option<String> {
    a.is_valid(i).then(|| a.value(i).to_owned())
}

/// Row `i` as RFC 3339 in UTC; `None` for a null or a time out of range.
pub(super) fn opt_time(a: &TimestampMicrosecondArray, i: usize) -> Option<String> {
    a.is_valid(i).then(|| rfc3339(a.value(i))).flatten()
}

pub(crate) use rsembed_schemas::datetime::micros_rfc3339 as rfc3339;

pub(super) fn string_col<'a>(
    batch: &'a RecordBatch,
    name: &str,
    uri: &str,
) -> Result<&'a StringArray> {
    batch
        .column_by_name(name)
        .and_then(|c| c.as_any().downcast_ref::<StringArray>())
        .ok_or_else(|| QueryError::column(uri, name, "a string column"))
}

#[cfg(test)]
mod tests {
    use super::*;

    use bytes::Bytes;
    use parquet::arrow::ArrowWriter;
    use parquet::file::metadata::ParquetMetaDataReader;
    use parquet::file::properties::WriterVersion;
    use rsembed_schemas::chip::Footprint;
    use rsembed_schemas::chip_file::chip_writer_properties;
    use rsembed_schemas::chip_file::rows::{
        chip_batch, CellColumns, CellRow, ChipRow, StacColumns,
    };
    use rsembed_schemas::embedding::EmbeddingType;
    use rsembed_schemas::ids::Window;

    /// Every answer column, every schema version's.
    fn answer() -> Vec<&'static str> {
        ANSWER_BASE
            .iter()
            .chain(&ANSWER_STAC)
            .chain(&ANSWER_CELLS)
            .copied()
            .collect()
    }

    /// 1,000 chip rows of schema 3, nulls in every nullable answer column.
    fn chip_rows() -> Vec<CellRow> {
        (0..1000)
            .map(|i| CellRow {
                chip: chip_row(i),
                cells: CellColumns {
                    cell: (i % 5 != 2).then(|| format!("EPSG:32633/10/256/{i}/-{}", i / 7)),
                    window_start: (i % 4 != 3).then(|| 1_704_067_200_000_000 + i as i64),
                    window_end: (i % 4 != 3).then(|| 1_711_929_600_000_000 + i as i64),
                    scenes: Some(3),
                },
            })
            .collect()
    }

    fn chip_row(i: i32) -> ChipRow {
        ChipRow {
            chip_id: format!("{i:032x}"),
            source_uri: format!("s3://b/scene-{}.tif", i / 100),
            source_version: Some("1".into()),
            window: Window {
                x: i * 16,
                y: -i,
                width: 16 + i % 3,
                height: 16,
            },
            valid_fraction: i as f32 / 1000.0,
            crs: (i % 3 != 0).then(|| format!("EPSG:{}", 32600 + i % 60)),
            footprint: (i % 4 != 1).then(|| Footprint {
                wkb: (0..(i % 50) as u8).collect(),
                bbox: [i as f64, 0.0, i as f64 + 1.0, 1.0],
            }),
            centre: (i % 4 != 1).then(|| [i as f64 + 0.5, -0.5 * i as f64]),
            embedding: vec![0.25; 4],
            stac: StacColumns {
                item_id: (i % 2 == 0).then(|| format!("item-{i}")),
                collection: (i % 5 != 0).then(|| "sentinel-2-l2a".into()),
                datetime: (i % 7 != 0).then(|| 1_700_000_000_000_000 + i as i64 * 1_000_001),
                end_datetime: (i % 3 == 0).then(|| 1_700_000_000_000_000 + i as i64),
                cloud_fraction: (i % 6 != 0).then(|| i as f32 / 2000.0),
            },
        }
    }

    /// Row group 0's answer column chunks of a chip file written with `version`.
    fn answer_chunks(rows: &[CellRow], version: WriterVersion) -> Vec<Chunk> {
        let batch = chip_batch(rows, 4, EmbeddingType::F32).unwrap();
        // Version 2's default for byte arrays without a dictionary is
        // DELTA_BYTE_ARRAY, which the in-place read leaves to the arrow reader.
        let props = chip_writer_properties(Vec::new(), EmbeddingType::F32)
            .into_builder()
            .set_writer_version(version)
            .set_encoding(parquet::basic::Encoding::PLAIN)
            // Pages of 256 rows, as other writers make them: pages without
            // a chosen row are skipped, the others read from the middle.
            .set_data_page_row_count_limit(256)
            .set_write_batch_size(256)
            .build();
        let mut buf = Vec::new();
        let mut w = ArrowWriter::try_new(&mut buf, batch.schema(), Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let file = Bytes::from(buf);
        let meta = ParquetMetaDataReader::new()
            .parse_and_finish(&file)
            .unwrap();
        let rg = meta.row_group(0);
        let leaves = meta.file_metadata().schema_descr().columns().to_vec();
        answer()
            .iter()
            .map(|name| {
                let leaf = leaves
                    .iter()
                    .position(|c| c.path().parts() == [*name])
                    .unwrap();
                let (start, len) = rg.column(leaf).byte_range();
                Chunk {
                    data: file.slice(start as usize..(start + len) as usize),
                    meta: rg.column(leaf).clone(),
                    rows: rows.len(),
                }
            })
            .collect()
    }

    #[test]
    fn answer_columns_read_in_place_are_the_rows_written() {
        let rows = chip_rows();
        let g = GroupRef {
            part: 0,
            row_group: 0,
        };
        // Both page versions; rows at the edges of the 256-row pages.
        let wanted = [0, 1, 3, 7, 255, 256, 257, 511, 600, 766, 998, 999];
        for version in [WriterVersion::PARQUET_1_0, WriterVersion::PARQUET_2_0] {
            let chunks = answer_chunks(&rows, version);
            assert!(chunks
                .iter()
                .all(|c| matches!(c.meta.compression(), parquet::basic::Compression::ZSTD(_))));
            let got = answer_rows(g, &wanted, &answer(), (&chunks, None), &None).unwrap();
            assert_eq!(got.len(), wanted.len());
            // Read from pages inflated ahead (a single query's idle core),
            // the same rows.
            let pages: Vec<Vec<Page>> =
                chunks.iter().map(|c| answer::inflate(c).unwrap()).collect();
            assert!(pages.iter().all(|p| p.len() > 1), "several pages a chunk");
            let ahead = answer_rows(g, &wanted, &answer(), (&chunks, Some(&pages)), &None).unwrap();
            assert_eq!(ahead, got);
            for (((gg, row), r), &w) in got.iter().zip(&wanted) {
                let (e, c) = (&rows[w].chip, &rows[w].cells);
                assert_eq!((*gg, *row), (g, w));
                assert_eq!(r.chip_id, e.chip_id);
                assert_eq!(r.source_uri, e.source_uri);
                assert_eq!(
                    (r.x, r.y, r.width, r.height),
                    (e.window.x, e.window.y, e.window.width, e.window.height)
                );
                assert_eq!(r.valid_fraction, e.valid_fraction);
                assert_eq!(r.crs, e.crs, "row {w}");
                let fp = e.footprint.as_ref();
                assert_eq!(r.wkb, fp.map(|f| f.wkb.clone()), "row {w}");
                assert_eq!(r.centre_lon, e.centre.map(|c| c[0]), "row {w}");
                assert_eq!(r.centre_lat, e.centre.map(|c| c[1]), "row {w}");
                assert_eq!(r.item_id, e.stac.item_id, "row {w}");
                assert_eq!(r.collection, e.stac.collection, "row {w}");
                assert_eq!(r.datetime, e.stac.datetime.and_then(rfc3339), "row {w}");
                assert_eq!(r.end_datetime, e.stac.end_datetime.and_then(rfc3339));
                assert_eq!(r.cloud_fraction, e.stac.cloud_fraction, "row {w}");
                assert_eq!(r.cell, c.cell, "row {w}");
                assert_eq!(r.window_start, c.window_start.and_then(rfc3339), "row {w}");
                assert_eq!(r.window_end, c.window_end.and_then(rfc3339), "row {w}");
                let grid = e
                    .centre
                    .and_then(|[lon, lat]| rsembed_schemas::majortom::grid_cell(lat, lon));
                assert_eq!(r.grid_cell, grid, "row {w}");
            }
            // Rows out of order or past the group are refused, not read.
            assert!(answer_rows(g, &[5, 4], &answer(), (&chunks, None), &None).is_err());
            assert!(answer_rows(g, &[1000], &answer(), (&chunks, None), &None).is_err());
        }
    }

    #[test]
    fn corrupt_answer_chunks_are_errors_never_panics() {
        let rows = chip_rows();
        let g = GroupRef {
            part: 0,
            row_group: 0,
        };
        let clean = answer_chunks(&rows, WriterVersion::PARQUET_1_0);
        let mut rng = crate::ivf::Rng(0x5eed);
        let mut next = move || rng.next_u64();
        let (mut ok, mut refused) = (0, 0);
        for _ in 0..1500 {
            let mut chunks: Vec<Chunk> = clean
                .iter()
                .map(|c| Chunk {
                    data: c.data.clone(),
                    meta: c.meta.clone(),
                    rows: c.rows,
                })
                .collect();
            let c = next() as usize % chunks.len();
            let mut data = chunks[c].data.to_vec();
            for _ in 0..1 + next() % 4 {
                let at = next() as usize % data.len();
                data[at] ^= 1 << (next() % 8);
            }
            chunks[c].data = data.into();
            match answer_rows(g, &[2, 300, 700], &answer(), (&chunks, None), &None) {
                Ok(_) => ok += 1,
                Err(_) => refused += 1,
            }
            // Inflated ahead, every page: an error or pages, never a panic,
            // and what they give is what the chunk gives.
            let pages: std::result::Result<Vec<_>, _> =
                chunks.iter().map(answer::inflate).collect();
            if let Ok(pages) = pages {
                let ahead =
                    answer_rows(g, &[2, 300, 700], &answer(), (&chunks, Some(&pages)), &None);
                if let Ok(rows) = ahead {
                    let direct = answer_rows(g, &[2, 300, 700], &answer(), (&chunks, None), &None);
                    assert_eq!(Ok(rows), direct);
                }
            }
        }
        // Most flips land in compressed bytes and are caught; some in bytes
        // no chosen row needs.
        assert!(refused > 100, "{ok} read, {refused} refused");
    }

    #[test]
    fn times_print_as_rfc3339_utc() {
        assert_eq!(
            rfc3339(1_720_000_000_000_000).as_deref(),
            Some("2024-07-03T09:46:40Z")
        );
        assert_eq!(rfc3339(1_500).as_deref(), Some("1970-01-01T00:00:00.0015Z"));
        assert_eq!(rfc3339(i64::MAX), None);
    }
}
