//! Pass 3: a bucket's rows sorted by key and written as one chip file through
//! an atomic upload, hashed on the way.

use arrow_array::cast::AsArray;
use arrow_array::types::Float64Type;
use arrow_array::{Array, RecordBatch};
use arrow_schema::SchemaRef;
use arrow_select::interleave::interleave_record_batch;
use parquet::arrow::async_writer::AsyncArrowWriter;
use parquet::errors::ParquetError;
use parquet::file::properties::WriterProperties;
use rsembed_schemas::chip::col;
use rsembed_schemas::chip_file::schema_with_file_metadata;
use rsembed_schemas::job::ManifestFile;
use rsembed_store::Location;

use super::keys::{batch_keys, find_duplicate, key_list, IdDigest, Key};
use super::{UPLOAD_CONCURRENCY, WRITE_BATCH_ROWS};
use crate::io::AtomicUpload;
use crate::{Error as QueryError, Result};

// ---- Pass 3: sort a bucket and write it --------------------------------------

/// A bucket's rows and the order to write them in.
pub(super) struct Sorted {
    pub(super) batches: Vec<RecordBatch>,
    /// (batch, row) in key order.
    pub(super) order: Vec<(usize, usize)>,
    pub(super) digest: IdDigest,
    pub(super) extent: Option<[f64; 4]>,
    pub(super) first: Option<Key>,
    pub(super) last: Option<Key>,
    /// Positions in `order` where a row group must start: where the list
    /// changes, in a file with a `list` column (none otherwise).
    pub(super) breaks: Vec<usize>,
}

pub(super) fn sort_bucket(batches: Vec<RecordBatch>, uri: &str) -> Result<Sorted> {
    let mut rows: Vec<(Key, u32, u32)> = Vec::new();
    for (bi, b) in batches.iter().enumerate() {
        for (ri, k) in batch_keys(b, uri)?.into_iter().enumerate() {
            rows.push((k, bi as u32, ri as u32));
        }
    }
    rows.sort_unstable_by_key(|r| r.0);
    let keys: Vec<Key> = rows.iter().map(|r| r.0).collect();
    if let Some(id) = find_duplicate(&keys) {
        return Err(QueryError::dataset(
            uri,
            format!(
                "chip_id {id:032x} is in it more than once: a dataset must hold each chip once \
                 (no manifest written, the output is incomplete)"
            ),
        ));
    }
    let mut digest = IdDigest::default();
    keys.iter().for_each(|k| digest.add(k.1));
    let mut extent: Option<[f64; 4]> = None;
    for b in &batches {
        let Some(bbox) = b.column_by_name(col::BBOX).and_then(|c| c.as_struct_opt()) else {
            continue;
        };
        let f = |i: usize| bbox.column(i).as_primitive_opt::<Float64Type>();
        let (Some(x0), Some(y0), Some(x1), Some(y1)) = (f(0), f(1), f(2), f(3)) else {
            continue;
        };
        for i in (0..bbox.len()).filter(|&i| bbox.is_valid(i)) {
            let r = [x0.value(i), y0.value(i), x1.value(i), y1.value(i)];
            extent = Some(match extent {
                None => r,
                Some(e) => [
                    e[0].min(r[0]),
                    e[1].min(r[1]),
                    e[2].max(r[2]),
                    e[3].max(r[3]),
                ],
            });
        }
    }
    let breaks = if batches
        .iter()
        .any(|b| b.column_by_name(crate::ivf::LIST).is_some())
    {
        (1..keys.len())
            .filter(|&i| key_list(keys[i].0) != key_list(keys[i - 1].0))
            .collect()
    } else {
        Vec::new()
    };
    Ok(Sorted {
        breaks,
        order: rows.iter().map(|r| (r.1 as usize, r.2 as usize)).collect(),
        batches,
        digest,
        extent,
        first: keys.first().copied(),
        last: keys.last().copied(),
    })
}

/// Writes a sorted bucket as the chip file `rel`; its manifest entry and row groups.
pub(super) async fn write_part(
    out: &Location,
    rel: &str,
    schema: SchemaRef,
    sorted: Sorted,
    props: WriterProperties,
) -> Result<(ManifestFile, usize)> {
    // `geo` and `rsembed` in the Arrow schema too, as in job files (Arrow C++ reads only those).
    let schema = schema_with_file_metadata(&schema, &props);
    let upload = AtomicUpload::new(&out.store, out.child(rel), UPLOAD_CONCURRENCY);
    let path = out.uri_of(&out.child(rel));
    let mut w = AsyncArrowWriter::try_new(upload, schema.clone(), Some(props)).map_err(|e| {
        QueryError::Write {
            path: path.clone(),
            source: Box::new(e),
        }
    })?;
    let refs: Vec<&RecordBatch> = sorted.batches.iter().collect();
    let written: std::result::Result<_, ParquetError> = async {
        let mut start = 0;
        for end in sorted.breaks.iter().copied().chain([sorted.order.len()]) {
            for chunk in sorted.order[start..end].chunks(WRITE_BATCH_ROWS) {
                let rows = interleave_record_batch(&refs, chunk)?;
                let rows = RecordBatch::try_new(schema.clone(), rows.columns().to_vec())?;
                w.write(&rows).await?;
            }
            if end < sorted.order.len() {
                // A new list starts a new row group, so its statistics name one list.
                w.flush().await?;
            }
            start = end;
        }
        w.finish().await
    }
    .await;
    let mut upload = w.into_inner();
    let md = match written {
        Ok(md) => md,
        Err(e) => {
            upload.abort().await;
            return Err(QueryError::Write {
                path,
                source: Box::new(e),
            });
        }
    };
    let rows = md.file_metadata().num_rows().max(0) as u64;
    if rows != sorted.order.len() as u64 {
        return Err(QueryError::Incomplete {
            path,
            problem: format!(
                "its footer says {rows} rows, {} were written",
                sorted.order.len()
            ),
        });
    }
    let file = ManifestFile {
        path: rel.to_owned(),
        rows,
        sha256: upload.sha256(),
        bytes: upload.bytes(),
        extent: None,
    };
    Ok((file, md.num_row_groups()))
}

#[cfg(test)]
mod tests {
    use super::super::keys::split_keys;
    use super::super::spill::Spill;
    use super::*;
    use rsembed_schemas::chip::chip_schema;

    fn chip_rows(ids: &[u128], dim: usize) -> RecordBatch {
        use rsembed_schemas::chip::Footprint;
        use rsembed_schemas::chip_file::rows::{chip_batch, ChipRow};
        use rsembed_schemas::ids::Window;
        let rows: Vec<ChipRow> = ids
            .iter()
            .map(|&id| {
                let lon = (id % 360) as f64 - 180.0;
                ChipRow {
                    chip_id: format!("{id:032x}"),
                    source_uri: "file:///x.tif".into(),
                    source_version: None,
                    window: Window {
                        x: 0,
                        y: 0,
                        width: 8,
                        height: 8,
                    },
                    valid_fraction: 1.0,
                    crs: (id % 3 != 0).then(|| "EPSG:4326".into()),
                    footprint: (id % 3 != 0).then(|| Footprint {
                        wkb: vec![1, 3, 0, 0, 0],
                        bbox: [lon, 0.0, lon + 1.0, 1.0],
                    }),
                    centre: (id % 3 != 0).then_some([lon + 0.5, 0.5]),
                    embedding: vec![id as f32; dim],
                    stac: Default::default(),
                }
            })
            .collect();
        chip_batch(&rows, dim, Default::default()).unwrap()
    }

    #[test]
    fn spilled_rows_come_back_sorted_once_each() {
        let dir = tempfile::tempdir().unwrap();
        let schema = chip_schema(4);
        let ids: Vec<u128> = (1..=500u128).map(|i| i * 7).collect();
        let all = chip_rows(&ids, 4);
        let all_keys = batch_keys(&all, "test").unwrap();
        let mut sorted_keys = all_keys.clone();
        sorted_keys.sort_unstable();
        let splits = split_keys(&sorted_keys, 3);
        let mut spill = Spill::new(dir.path(), schema, splits.len() + 1);
        for start in (0..500).step_by(64) {
            let len = 64.min(500 - start);
            spill.route(all.slice(start, len), &splits, "test").unwrap();
            // Force many small frames.
            spill.flush_all().unwrap();
        }
        assert_eq!(spill.rows.iter().sum::<u64>(), 500);
        let mut digest = IdDigest::default();
        let mut seen: Vec<Key> = Vec::new();
        for b in 0..spill.rows.len() {
            let sorted = sort_bucket(Spill::read(&spill.path(b)).unwrap(), "test").unwrap();
            assert_eq!(sorted.order.len() as u64, spill.rows[b]);
            digest.merge(&sorted.digest);
            for &(bi, ri) in &sorted.order {
                let k = batch_keys(&sorted.batches[bi].slice(ri, 1), "test").unwrap()[0];
                seen.push(k);
            }
            let e = sorted.extent.unwrap();
            assert!(e[0] >= -180.0 && e[2] <= 181.0 && e[1] == 0.0 && e[3] == 1.0);
        }
        assert_eq!(
            seen, sorted_keys,
            "every row once, in key order across buckets"
        );
        let mut want = IdDigest::default();
        ids.iter().for_each(|id| want.add(*id));
        assert_eq!(digest, want);
    }

    #[test]
    fn a_bucket_with_a_chip_twice_is_refused() {
        let b = chip_rows(&[3, 4, 3], 2);
        let err = sort_bucket(vec![b], "file:///d").err().unwrap().to_string();
        assert!(err.contains(&format!("{:032x}", 3u128)), "{err}");
    }
}
