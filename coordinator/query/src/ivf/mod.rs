//! The IVF layout: spherical k-means over a sample of a dataset's
//! embeddings, each row's nearest list, `centroids.parquet`, and the lists a
//! search probes.
//!
//! Embeddings are unit vectors and search ranks by cosine, so lists are
//! compared by dot product: a row belongs to the centroid of highest dot
//! product (ties to the lower list), and centroids are the normalised means
//! of their rows (spherical k-means). Everything here is deterministic for a
//! seed: the sample is chosen by a hash of the chip id (whatever the file
//! order), k-means++ draws from a seeded generator, sums are taken in one
//! fixed order, and the dot products are `crate::kernels::dot`'s
//! (same lanes, same reduction), so a row's list is the one a scan would
//! rank first.
//!
//! Compaction's side is in the coordinator's `compact/lists.rs`; search's is
//! [`Probe`].

mod centroids;
mod kmeans;
mod probe;

pub use centroids::{centroids_schema, encode_centroids, read_centroids, CENTROID_GROUP_ROWS};
pub use kmeans::{kmeans, KMeans, Rng};
pub use probe::{Probe, Probed};

use crate::kernels::nearest;
use kmeans::per_thread;

pub use crate::format::LIST;
/// Most lists: a list number takes the top 16 bits of compaction's sort key.
pub const MAX_LISTS: u32 = 1 << 16;
/// k-means++ and Lloyd's seed when `--seed` is not given.
pub const DEFAULT_SEED: u64 = 0;
/// Lloyd iterations at most (fewer once no sample row changes list):
/// FAISS's default is 25; on clustered unit vectors assignments settle well
/// before 20.
pub const KMEANS_ITERATIONS: u32 = 20;
/// Sample rows per list by default: FAISS warns below 39 and stops using
/// more than 256.
pub const SAMPLE_PER_LIST: u64 = 64;
/// The default sample's embeddings take at most this much memory.
pub const SAMPLE_BYTES: u64 = 256 << 20;

/// The default sample size for `lists` lists of `dim` floats over `rows` rows.
pub fn default_sample(rows: u64, lists: u32, dim: usize) -> u64 {
    let cap = (SAMPLE_BYTES / (4 * dim.max(1) as u64)).max(u64::from(lists));
    rows.min(SAMPLE_PER_LIST * u64::from(lists)).min(cap)
}

/// The lists a search probes when `--nprobe` is not given: one in 16,
/// at least 8 (all of them when there are at most 8). Measured on
/// clustered D = 768 unit vectors (docs/benchmarks.md, "IVF"): recall@10
/// ≥ 0.95 from about 3 % of the lists on, so 6 % leaves a margin for data
/// less clustered than that, at 6 % of an exact scan's bytes.
pub fn default_nprobe(lists: usize) -> usize {
    lists.div_ceil(16).max(8).min(lists)
}

/// `--nprobe`: how many lists a search reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NProbe {
    /// Every list: the exact search.
    All,
    /// The P lists whose centroids are nearest the query.
    Lists(usize),
}

/// Parses `--nprobe`: a positive number, or `all`.
pub fn parse_nprobe(s: &str) -> std::result::Result<NProbe, String> {
    if s.eq_ignore_ascii_case("all") {
        return Ok(NProbe::All);
    }
    match s.parse::<usize>() {
        Ok(n) if n > 0 => Ok(NProbe::Lists(n)),
        _ => Err(format!(
            "{s:?}: want a number of lists (1 or more) or `all`"
        )),
    }
}

/// Unit centroids, row-major, `lists × dim`.
#[derive(Debug, Clone, PartialEq)]
pub struct Centroids {
    /// Dimension.
    pub dim: usize,
    /// The values.
    pub values: Vec<f32>,
}

impl Centroids {
    /// Lists.
    pub fn lists(&self) -> usize {
        self.values.len() / self.dim
    }

    /// `out[i]` = the list of row `i` of `rows` (`out.len()` rows of `dim`),
    /// and its dot product; on several threads when there is enough work.
    pub fn nearest(&self, rows: &[f32], out: &mut [(u32, f32)]) {
        let per = per_thread(out.len(), out.len() * self.values.len());
        if per >= out.len() {
            nearest(&self.values, self.dim, rows, out);
            return;
        }
        std::thread::scope(|s| {
            for (i, chunk) in out.chunks_mut(per).enumerate() {
                let rows = &rows[i * per * self.dim..];
                s.spawn(move || nearest(&self.values, self.dim, rows, chunk));
            }
        });
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    use super::*;

    pub(crate) fn gen(seed: u64, n: usize, dim: usize, centres: usize, spread: f32) -> Vec<f32> {
        let mut r = Rng(seed);
        let mut gauss = move || {
            let (u1, u2) = (1.0 - r.unit(), r.unit());
            ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
        };
        let cs: Vec<Vec<f32>> = (0..centres)
            .map(|_| unit((0..dim).map(|_| gauss()).collect()))
            .collect();
        let mut out = Vec::new();
        for i in 0..n {
            let c = &cs[i % centres];
            out.extend(unit(c.iter().map(|x| x + spread * gauss()).collect()));
        }
        out
    }

    pub(crate) fn unit(v: Vec<f32>) -> Vec<f32> {
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.into_iter().map(|x| x / n).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nprobe_parses_numbers_and_all() {
        assert_eq!(parse_nprobe("all"), Ok(NProbe::All));
        assert_eq!(parse_nprobe("12"), Ok(NProbe::Lists(12)));
        assert!(parse_nprobe("0").is_err());
        assert!(parse_nprobe("-1").is_err());
        assert_eq!(default_nprobe(4), 4);
        assert_eq!(default_nprobe(100), 8);
        assert_eq!(default_nprobe(1000), 63);
        assert_eq!(default_sample(1_000_000, 1000, 768), 64_000);
        assert_eq!(default_sample(1000, 1000, 768), 1000);
        assert_eq!(default_sample(10_000_000, 4000, 768), 87_381);
    }
}
