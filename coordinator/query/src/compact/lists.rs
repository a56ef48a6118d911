//! `compact --lists N`: the IVF layout's share of compaction.
//!
//! - **Sample** (after pass 1): the `--sample` rows of lowest hash of their
//!   chip id are read with their embeddings and sort keys, so the sample is
//!   the same whatever the order of files and row groups; it is held in one
//!   slab (`--sample` × D floats), and rows above the running threshold are
//!   dropped where they are read.
//! - **Train**: spherical k-means on the sample, in chip-id order
//!   ([`crate::ivf::kmeans`]). The sample's rows, with their lists,
//!   are also the sample the output files are split by.
//! - **Label** (pass 2): each row read gets its nearest list as a `list`
//!   column, appended after the chip columns; its sort key is then (list,
//!   Hilbert index, chip id) ([`super::keys::list_key`]), so pass 3 sorts
//!   files by list and cuts row groups where the list changes.
//! - **Write**: `centroids.parquet`, with each list's row count, recorded
//!   as `ivf` in the manifest.

use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arrow_array::{Int32Array, RecordBatch};
use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef};
use futures::StreamExt;
use object_store::{ObjectStoreExt, PutPayload};
use rsembed_schemas::chip::col;
use rsembed_schemas::job::{IvfLayout, ManifestFile, CENTROIDS_FILE};
use rsembed_store::Location;
use sha2::{Digest, Sha256};

use super::keys::{batch_keys, list_key, Key};
use super::Progress;
use crate::format::embeddings;
use crate::format::index::{GroupRef, Index};
use crate::ivf::{self, Centroids, LIST};
use crate::scan::{default_concurrency, scan_groups};
use crate::{Error as QueryError, Result};

/// A trained IVF layout and the rows each list got.
pub(super) struct Lists {
    pub(super) centroids: Arc<Centroids>,
    /// Rows labelled with each list (pass 2).
    pub(super) rows: Vec<u64>,
    seed: u64,
    sample: u64,
    iterations: u32,
}

/// `fields` with a trailing `list` column dropped: a dataset compacted
/// with `--lists` compacts again (its old lists are recomputed).
pub(crate) fn without_list(fields: &Fields) -> Fields {
    match fields.last() {
        Some(f) if f.name() == LIST => fields.iter().take(fields.len() - 1).cloned().collect(),
        _ => fields.clone(),
    }
}

/// The chip schema with the `list` column appended.
pub(super) fn with_list(schema: &SchemaRef) -> SchemaRef {
    let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.push(Field::new(LIST, DataType::Int32, false));
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// A 64-bit hash of a chip id for the sample (not keys.rs's: the two
/// samples need not be the same rows).
fn sample_hash(id: u128) -> u64 {
    let mut z =
        (id as u64).wrapping_add(0x2545_F491_4F6C_DD1D) ^ ((id >> 64) as u64).rotate_left(23);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Sample rows of one row group: (hash, key, embedding).
type Candidates = Vec<(u64, Key, Vec<f32>)>;

/// Reads the sample, runs k-means; returns the layout and the sample's
/// keys with their lists, sorted (the split sample).
pub(super) async fn train(
    index: &Arc<Index>,
    lists: u32,
    sample: Option<u64>,
    seed: u64,
    progress: &Progress,
) -> Result<(Lists, Vec<Key>)> {
    let dim = index.embed_dim;
    let rows = index.rows();
    let m = sample.unwrap_or_else(|| ivf::default_sample(rows, lists, dim));
    if m.min(rows) < u64::from(lists) {
        return Err(QueryError::flag(
            "--lists",
            format!(
                "{lists}: k-means needs at least one sample row per list, and the sample has {} \
                 (the dataset holds {rows} rows{}): ask for fewer lists",
                m.min(rows),
                sample.map_or(String::new(), |s| format!(", --sample {s}"))
            ),
        ));
    }
    let cap = usize::try_from(m).unwrap_or(usize::MAX).min(rows as usize);
    progress.phase("sample");
    let threshold = Arc::new(AtomicU64::new(u64::MAX));
    let limit = threshold.clone();
    let (groups, _) = index.row_groups(None);
    let uris: Arc<Vec<String>> = Arc::new(index.parts.iter().map(|p| p.uri.clone()).collect());
    let stream = scan_groups(
        index.clone(),
        groups,
        vec![
            col::CHIP_ID,
            col::CENTRE_LON,
            col::CENTRE_LAT,
            col::EMBEDDING,
        ],
        Vec::new(),
        default_concurrency(),
        Vec::new,
        move |acc: &mut Candidates, g: GroupRef, _: usize, batch: &RecordBatch| {
            let uri = &uris[g.part];
            let keys = batch_keys(batch, uri)?;
            let values = embeddings(batch, dim, uri)?;
            let t = limit.load(Ordering::Relaxed);
            for (i, k) in keys.into_iter().enumerate() {
                let h = sample_hash(k.1);
                if h <= t {
                    acc.push((h, k, values.row(i, dim)));
                }
            }
            Ok::<(), crate::Error>(())
        },
    );
    futures::pin_mut!(stream);
    // Max-heap on (hash, id): its top is the row that leaves first.
    let mut heap: BinaryHeap<(u64, u128, usize)> = BinaryHeap::with_capacity(cap + 1);
    let mut slab: Vec<f32> = Vec::new();
    let mut keys: Vec<Key> = Vec::new();
    while let Some(r) = stream.next().await {
        let (_, candidates) = r?;
        for (h, k, v) in candidates {
            if heap.len() < cap {
                heap.push((h, k.1, keys.len()));
                keys.push(k);
                slab.extend_from_slice(&v);
            } else if heap.peek().is_some_and(|top| (h, k.1) < (top.0, top.1)) {
                let (_, _, slot) = heap.pop().expect("a full heap has a top");
                heap.push((h, k.1, slot));
                keys[slot] = k;
                slab[slot * dim..(slot + 1) * dim].copy_from_slice(&v);
            } else {
                continue;
            }
            if heap.len() == cap {
                let top = heap.peek().expect("a full heap has a top").0;
                threshold.store(top, Ordering::Relaxed);
            }
        }
    }
    // Chip-id order, so that k-means sees the same rows in the same order on every run.
    let mut slots: Vec<(u128, usize)> = heap.into_iter().map(|(_, id, s)| (id, s)).collect();
    slots.sort_unstable();
    let sample_rows: Vec<f32> = slots
        .iter()
        .flat_map(|&(_, s)| slab[s * dim..(s + 1) * dim].iter().copied())
        .collect();
    drop(slab);
    let sample_keys: Vec<Key> = slots.iter().map(|&(_, s)| keys[s]).collect();
    let n = slots.len() as u64;

    progress.phase("k-means");
    let started = std::time::Instant::now();
    let (km, labels) = tokio::task::spawn_blocking(move || {
        let km = ivf::kmeans(
            &sample_rows,
            dim,
            lists as usize,
            seed,
            ivf::KMEANS_ITERATIONS,
        );
        let mut labels = vec![(0u32, 0f32); sample_rows.len() / dim];
        km.centroids.nearest(&sample_rows, &mut labels);
        (km, labels)
    })
    .await
    .map_err(|source| QueryError::Task {
        what: "k-means",
        source,
    })?;
    tracing::info!(
        lists,
        sample = n,
        iterations = km.iterations,
        seconds = started.elapsed().as_secs_f64(),
        "k-means done"
    );
    let mut split: Vec<Key> = sample_keys
        .iter()
        .zip(&labels)
        .map(|(k, l)| (list_key(l.0, k.0), k.1))
        .collect();
    split.sort_unstable();
    Ok((
        Lists {
            rows: vec![0; km.centroids.lists()],
            centroids: Arc::new(km.centroids),
            seed,
            sample: n,
            iterations: km.iterations,
        },
        split,
    ))
}

impl Lists {
    /// `batch` with its rows' lists appended as the `list` column.
    pub(super) fn label(&mut self, batch: RecordBatch, uri: &str) -> Result<RecordBatch> {
        let dim = self.centroids.dim;
        let mut near = vec![(0u32, 0f32); batch.num_rows()];
        // Unit float32 rows whatever the stored type (a copy for f16 and int8).
        let rows = embeddings(&batch, dim, uri)?.unit_rows(dim);
        self.centroids.nearest(&rows, &mut near);
        for (l, _) in &near {
            self.rows[*l as usize] += 1;
        }
        let list = Int32Array::from_iter_values(near.iter().map(|n| n.0 as i32));
        let schema = with_list(&batch.schema());
        let mut columns = batch.columns().to_vec();
        columns.push(Arc::new(list));
        RecordBatch::try_new(schema, columns).map_err(|source| QueryError::Rows {
            uri: uri.to_owned(),
            source,
        })
    }

    /// Writes `centroids.parquet` to `out`; the manifest's record of it.
    pub(super) async fn write(&self, out: &Location) -> Result<IvfLayout> {
        let bytes = ivf::encode_centroids(&self.centroids, &self.rows)?;
        let file = ManifestFile {
            path: CENTROIDS_FILE.to_owned(),
            rows: self.rows.len() as u64,
            sha256: hex::encode(Sha256::digest(&bytes)),
            bytes: bytes.len() as u64,
            extent: None,
        };
        out.store
            .put(&out.child(CENTROIDS_FILE), PutPayload::from(bytes))
            .await?;
        Ok(IvfLayout {
            centroids: file,
            lists: self.rows.len() as u32,
            empty_lists: self.rows.iter().filter(|&&n| n == 0).count() as u32,
            metric: "dot".to_owned(),
            seed: self.seed,
            sample: self.sample,
            iterations: self.iterations,
        })
    }
}
