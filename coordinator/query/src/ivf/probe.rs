//! The lists a search probes: an IVF dataset's centroids opened once,
//! and each query's best lists among them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use rsembed_schemas::job::{IvfLayout, MANIFEST_FILE};

use crate::format::index::Index;
use crate::kernels::{dot4, dots};
use crate::{Error, Result};

use super::centroids::WHOLE_CENTROIDS_BYTES;
use super::kmeans::per_thread;
use super::{default_nprobe, read_centroids, Centroids, NProbe};

/// `ivf` of a manifest, the only key a probe needs.
#[derive(serde::Deserialize)]
struct WithIvf {
    #[serde(default)]
    ivf: Option<IvfLayout>,
}

/// An IVF dataset's centroids, opened for a search.
#[derive(Debug)]
pub struct Probe {
    /// The centroids and each list's rows, when held (a resident search
    /// ranks them for every query); a single pass reads them as it ranks.
    held: Option<(Centroids, Vec<u64>)>,
    /// The index's store.
    store: Arc<dyn ObjectStore>,
    /// `centroids.parquet`: path, URI and the sha256 the manifest records.
    file: (Path, String, String),
    /// Embedding dimension.
    dim: usize,
    /// Lists in the layout.
    lists: usize,
    /// [`WHOLE_CENTROIDS_BYTES`], but in tests.
    whole: u64,
    /// Lists probed.
    pub nprobe: usize,
    /// Bytes fetched for it (manifest and centroids).
    bytes_read: AtomicU64,
}

/// The lists a batch of queries probes, and which queries probe each.
///
/// Each query is scored against exactly the row groups a search of it alone
/// would read, so its answer does not depend on the rest of its batch.
#[derive(Debug, Clone)]
pub struct Probed {
    /// By list: the queries (their indices in the batch, ascending) that
    /// probe it.
    by_list: Vec<Arc<[u32]>>,
    /// Every query of the batch, for groups the statistics say nothing of;
    /// shared, not one copy a group.
    all: Arc<[u32]>,
}

impl Probe {
    /// The IVF layout of `index`, when its manifest records one and `nprobe`
    /// asks for fewer than all lists, with its centroids read and `held`
    /// when asked (a resident search). `--nprobe P` on a dataset without
    /// lists is refused (it would silently be an exact scan); `--nprobe
    /// all` is what such a dataset does anyway.
    pub async fn open(index: &Index, nprobe: Option<NProbe>, hold: bool) -> Result<Option<Probe>> {
        let layout = match &index.manifest {
            Some(_) => {
                let loc = &index.root;
                let bytes = loc
                    .store
                    .get(&loc.child(MANIFEST_FILE))
                    .await?
                    .bytes()
                    .await?;
                let m: WithIvf =
                    serde_json::from_slice(&bytes).map_err(|source| Error::Manifest {
                        uri: format!("{}/{MANIFEST_FILE}", loc.url),
                        source,
                    })?;
                m.ivf.map(|l| (l, bytes.len() as u64))
            }
            None => None,
        };
        let Some((layout, manifest_bytes)) = layout else {
            return match nprobe {
                Some(NProbe::Lists(_)) => Err(Error::flag(
                    "--nprobe",
                    format!(
                        "{} has no lists (no `ivf` in its manifest): make an IVF layout with \
                         `rsembed compact --lists N`, or leave --nprobe out for an exact search",
                        index.root.url
                    ),
                )),
                _ => Ok(None),
            };
        };
        if nprobe == Some(NProbe::All) {
            return Ok(None);
        }
        let loc = &index.root;
        let uri = format!(
            "{}/{}",
            loc.url.as_str().trim_end_matches('/'),
            layout.centroids.path
        );
        let lists = layout.lists as usize;
        let mut probe = Probe {
            held: None,
            store: loc.store.clone(),
            file: (
                loc.child(&layout.centroids.path),
                uri,
                layout.centroids.sha256,
            ),
            dim: index.embed_dim,
            lists,
            whole: WHOLE_CENTROIDS_BYTES,
            nprobe: match nprobe {
                Some(NProbe::Lists(p)) => p.min(lists),
                _ => default_nprobe(lists),
            },
            bytes_read: AtomicU64::new(manifest_bytes),
        };
        if hold {
            probe.hold().await?;
        }
        Ok(Some(probe))
    }

    /// Reads the centroids into memory, to rank them for query after query.
    async fn hold(&mut self) -> Result<()> {
        let (mut values, mut rows) = (Vec::new(), Vec::new());
        self.read(|_, v, r| {
            values.extend_from_slice(v);
            rows.extend_from_slice(r);
        })
        .await?;
        let dim = self.dim;
        self.held = Some((Centroids { dim, values }, rows));
        Ok(())
    }

    /// Bytes fetched for the probe so far (manifest and centroids).
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read.load(Ordering::Relaxed)
    }

    async fn read(&self, each: impl FnMut(u32, &[f32], &[u64])) -> Result<()> {
        let (path, uri, sha) = &self.file;
        let dims = (self.dim, self.lists, self.whole);
        let n = read_centroids(&self.store, path, uri, sha, dims, each).await?;
        self.bytes_read.fetch_add(n, Ordering::Relaxed);
        Ok(())
    }

    /// The lists each of the unit `queries` probes: its `nprobe` best
    /// non-empty lists by dot product with the centroids (ties to the lower
    /// list), on several threads when there is enough work; centroids not
    /// held are read as they are ranked.
    pub async fn probe(&self, queries: &[&[f32]]) -> Result<Probed> {
        let dim = self.dim;
        let per = per_thread(queries.len(), queries.len() * self.lists * dim);
        let chunks: Vec<&[&[f32]]> = queries.chunks(per).collect();
        let mut bests: Vec<Best> = chunks
            .iter()
            .map(|c| Best::new(c.len(), self.nprobe))
            .collect();
        match &self.held {
            Some((c, rows)) => offer(&mut bests, &chunks, dim, (0, &c.values, rows)),
            None => {
                self.read(|first, values, rows| {
                    offer(&mut bests, &chunks, dim, (first, values, rows));
                })
                .await?
            }
        }
        let chosen = bests.into_iter().flat_map(Best::finish);
        Ok(Probed::of(chosen, self.lists, queries.len()))
    }
}

/// Offers centroids (first list, values, rows) to each chunk of queries'
/// [`Best`]; one chunk on this thread (a thread started and joined for it
/// was 4 % of a resident query at `--nprobe 1`, `clone3` alone), more on
/// one thread each.
fn offer(bests: &mut [Best], chunks: &[&[&[f32]]], dim: usize, cents: (u32, &[f32], &[u64])) {
    if let [best] = bests {
        best.offer(chunks[0], dim, cents);
        return;
    }
    std::thread::scope(|s| {
        for (best, chunk) in bests.iter_mut().zip(chunks) {
            s.spawn(move || best.offer(chunk, dim, cents));
        }
    });
}

/// Each query's best lists among the centroids offered so far: at most
/// `nprobe` after each offer, in the order "higher dot product, then lower
/// list", a total order, so that the lists chosen do not depend on how the
/// centroids came in.
struct Best {
    nprobe: usize,
    kept: Vec<Vec<(f32, u32)>>,
    scores: Vec<[f32; 4]>,
    one: Vec<f32>,
}

impl Best {
    fn new(queries: usize, nprobe: usize) -> Best {
        Best {
            nprobe,
            kept: vec![Vec::new(); queries],
            scores: Vec::new(),
            one: Vec::new(),
        }
    }

    fn offer(
        &mut self,
        queries: &[&[f32]],
        dim: usize,
        (first, values, rows): (u32, &[f32], &[u64]),
    ) {
        let lists = rows.len().min(values.len() / dim);
        self.scores.resize(lists, [0f32; 4]);
        self.one.resize(lists, 0.0);
        let values = &values[..lists * dim];
        for (ci, chunk) in queries.chunks(4).enumerate() {
            if let [q] = chunk {
                // One query (a resident search's line): a quarter of the
                // work of four lanes of the same query, 13 % of such a
                // query's time before.
                dots(values, dim, q, &mut self.one);
                for (s, &d) in self.scores.iter_mut().zip(&self.one) {
                    s[0] = d;
                }
            } else {
                let q = |k: usize| chunk[k.min(chunk.len() - 1)];
                let four = [q(0), q(1), q(2), q(3)];
                for (s, c) in self.scores.iter_mut().zip(values.chunks_exact(dim)) {
                    *s = dot4(four, c);
                }
            }
            for k in 0..chunk.len() {
                let kept = &mut self.kept[ci * 4 + k];
                kept.extend(
                    (0..lists)
                        .filter(|&l| rows[l] > 0)
                        .map(|l| (self.scores[l][k], first + l as u32)),
                );
                keep_best(kept, self.nprobe);
            }
        }
    }

    /// Each query's lists, ascending.
    fn finish(self) -> impl Iterator<Item = Vec<u32>> {
        self.kept.into_iter().map(|kept| {
            let mut ls: Vec<u32> = kept.into_iter().map(|(_, l)| l).collect();
            ls.sort_unstable();
            ls
        })
    }
}

/// Keeps the `n` best of `kept`: higher score first, then lower list.
fn keep_best(kept: &mut Vec<(f32, u32)>, n: usize) {
    if kept.len() > n {
        kept.select_nth_unstable_by(n, |a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        kept.truncate(n);
    }
}

impl Probed {
    /// The probe of `queries` queries over `lists` lists, from each query's
    /// lists.
    fn of(chosen: impl Iterator<Item = Vec<u32>>, lists: usize, queries: usize) -> Probed {
        let mut by_list = vec![Vec::new(); lists];
        for (qi, ls) in chosen.enumerate() {
            for l in ls {
                by_list[l as usize].push(qi as u32);
            }
        }
        // Lists no query probes share one empty slice: a thousand
        // allocations a resident query otherwise.
        let none: Arc<[u32]> = Arc::from([]);
        Probed {
            by_list: by_list
                .into_iter()
                .map(|qs| {
                    if qs.is_empty() {
                        none.clone()
                    } else {
                        Arc::from(qs)
                    }
                })
                .collect(),
            all: (0..queries as u32).collect(),
        }
    }

    /// The queries that score a row group whose `list` statistics give
    /// `list` (least and greatest): those probing a list in it, ascending;
    /// every query when it has no usable statistics (such a group is read).
    /// Empty: skip the group.
    pub fn scorers(&self, list: Option<(i32, i32)>) -> Arc<[u32]> {
        let all = || self.all.clone();
        let Some((lo, hi)) = list else {
            return all();
        };
        let n = self.by_list.len() as i64;
        let (lo, hi) = (i64::from(lo), i64::from(hi));
        // Statistics naming no list of the centroids prove nothing: read the group.
        if lo > hi || lo < 0 || hi >= n {
            return all();
        }
        if lo == hi {
            return self.by_list[lo as usize].clone();
        }
        let mut qs: Vec<u32> = (lo..=hi)
            .flat_map(|l| self.by_list[l as usize].iter().copied())
            .collect();
        qs.sort_unstable();
        qs.dedup();
        qs.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ivf::centroids::test_support::centroids_file;
    use crate::ivf::test_support::{gen, unit};
    use crate::kernels::dot;
    use rsembed_schemas::job::CENTROIDS_FILE;

    fn probe_of(
        file: &(Arc<dyn ObjectStore>, Path, String),
        dim: usize,
        lists: usize,
        nprobe: usize,
        whole: u64,
    ) -> Probe {
        Probe {
            held: None,
            store: file.0.clone(),
            file: (file.1.clone(), "c".into(), file.2.clone()),
            dim,
            lists,
            whole,
            nprobe,
            bytes_read: AtomicU64::new(0),
        }
    }

    #[tokio::test]
    async fn a_batch_probes_each_query_s_best_non_empty_lists_held_or_read_as_ranked() {
        let dim = 24;
        // Two row groups of the file (256 and 44 centroids).
        let lists = 300;
        let cents = Centroids {
            dim,
            values: unit(gen(5, lists, dim, lists, 0.0)),
        };
        let mut rows = vec![10u64; lists];
        for l in (0..lists).step_by(7) {
            rows[l] = 0;
        }
        let dir = tempfile::tempdir().unwrap();
        let file = centroids_file(dir.path(), &cents, &rows);
        let streamed = probe_of(&file, dim, lists, 9, 0);
        let whole = probe_of(&file, dim, lists, 9, u64::MAX);
        let mut held = probe_of(&file, dim, lists, 9, 0);
        held.hold().await.unwrap();
        assert_eq!(held.held, Some((cents.clone(), rows.clone())));
        // Enough queries for the threaded path (work ≥ 2^22), and a ragged last chunk.
        let qs = unit(gen(6, 1_003, dim, 50, 0.3));
        let queries: Vec<&[f32]> = qs.chunks_exact(dim).collect();
        assert!(queries.len() * cents.values.len() >= 1 << 22);
        let mut want = vec![Vec::new(); lists];
        for (qi, q) in queries.iter().enumerate() {
            let d: Vec<f32> = cents.values.chunks_exact(dim).map(|c| dot(c, q)).collect();
            let mut order: Vec<usize> = (0..lists).filter(|&l| rows[l] > 0).collect();
            order.sort_by(|&a, &b| d[b].total_cmp(&d[a]).then(a.cmp(&b)));
            for &l in &order[..9] {
                want[l].push(qi as u32);
            }
        }
        for probe in [&streamed, &whole, &held] {
            for qs in [&queries[..], &queries[..1], &queries[..3]] {
                let probed = probe.probe(qs).await.unwrap();
                let got: Vec<Vec<u32>> = probed.by_list.iter().map(|q| q.to_vec()).collect();
                let want: Vec<Vec<u32>> = want
                    .iter()
                    .map(|w| {
                        w.iter()
                            .copied()
                            .filter(|&q| (q as usize) < qs.len())
                            .collect()
                    })
                    .collect();
                assert_eq!(got, want);
                assert_eq!(probed.all.len(), qs.len());
            }
        }
        // Read as ranked: the file for each probe, streamed twice over.
        let size = std::fs::metadata(dir.path().join(CENTROIDS_FILE))
            .unwrap()
            .len();
        assert!(
            streamed.bytes_read() > 3 * 2 * size - 3 * 1000,
            "{}",
            streamed.bytes_read()
        );
        assert_eq!(whole.bytes_read(), 3 * size);
    }
}
