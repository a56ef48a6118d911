//! Spherical k-means over a sample of unit rows: k-means++ seeding, then
//! Lloyd iterations, deterministic for a seed.

use super::Centroids;

/// Items each thread takes of `items` that cost `work` multiply-adds in
/// all: every item on one thread below 2^22 (a thread costs more than it
/// saves there), else an even split over the cores; in blocks of 4, the unit
/// of [`dot4`], so that a split never changes a result.
pub fn per_thread(items: usize, work: usize) -> usize {
    let threads = if work < (1 << 22) {
        1
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    };
    items.div_ceil(threads).div_ceil(4).max(1) * 4
}

/// SplitMix64: the seeded choices of k-means++ (and the tests' seeded
/// mutations).
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Centroids seeded per pass over the sample (see [`kmeans`]).
const SEED_BATCH: usize = 8;

/// What k-means made.
#[derive(Debug, Clone)]
pub struct KMeans {
    /// The centroids.
    pub centroids: Centroids,
    /// Lloyd iterations run.
    pub iterations: u32,
}

/// Spherical k-means of the unit rows `sample` (`m × dim`) into `lists`
/// centroids: k-means++ seeding by `seed` (weights 1 − the best dot product,
/// half the squared distance; from the 8th on, up to 8 drawn per
/// pass, as in k-means‖'s oversampling rounds), then Lloyd iterations until no row changes
/// list or `max_iterations`. A list left empty is given the row farthest
/// from its centroid, so that no centroid is wasted on the sample.
pub fn kmeans(sample: &[f32], dim: usize, lists: usize, seed: u64, max_iterations: u32) -> KMeans {
    let m = sample.len() / dim;
    assert!(
        lists >= 1 && m >= lists,
        "k-means of {m} rows into {lists} lists"
    );
    let row = |i: usize| &sample[i * dim..(i + 1) * dim];
    let mut rng = Rng(seed ^ 0x5EED_1F5E_ED15_EED5);
    let mut values = Vec::with_capacity(lists * dim);
    let first = (rng.next_u64() % m as u64) as usize;
    values.extend_from_slice(row(first));
    let mut best = vec![(0u32, 0f32); m];
    Centroids {
        dim,
        values: values.clone(),
    }
    .nearest(sample, &mut best);
    let mut one = vec![(0u32, 0f32); m];
    // Once l centroids are placed, a pass over the sample seeds up to
    // l / 8 (at most SEED_BATCH) drawn from the same weights, then updates
    // every row's best dot product against all of them at once. A pass
    // against one centroid is bound by reading the sample from memory (196 MB
    // at 64 000 rows of 768): seeding 1 000 lists one a pass took 30 of
    // k-means' 32 s. The first centroids, where two draws from one cluster
    // would cost the most, are still placed one a pass.
    let mut l = 1;
    while l < lists {
        let batch = (l / 8).clamp(1, SEED_BATCH).min(lists - l);
        let weights: Vec<f64> = best
            .iter()
            .map(|b| (1.0 - f64::from(b.1)).max(0.0))
            .collect();
        let total: f64 = weights.iter().sum();
        for _ in 0..batch {
            let pick = if total > 0.0 && total.is_finite() {
                let mut t = rng.unit() * total;
                let mut pick = m - 1;
                for (i, w) in weights.iter().enumerate() {
                    if t < *w {
                        pick = i;
                        break;
                    }
                    t -= w;
                }
                pick
            } else {
                (rng.next_u64() % m as u64) as usize
            };
            values.extend_from_slice(row(pick));
        }
        let c = Centroids {
            dim,
            values: values[l * dim..].to_vec(),
        };
        c.nearest(sample, &mut one);
        for (b, o) in best.iter_mut().zip(&one) {
            if o.1 > b.1 {
                *b = (l as u32 + o.0, o.1);
            }
        }
        l += batch;
    }
    let mut centroids = Centroids { dim, values };
    let mut labels = vec![(u32::MAX, 0f32); m];
    let mut next = vec![(0u32, 0f32); m];
    let mut iterations = 0;
    while iterations < max_iterations {
        centroids.nearest(sample, &mut next);
        iterations += 1;
        if next.iter().map(|n| n.0).eq(labels.iter().map(|l| l.0)) {
            break;
        }
        std::mem::swap(&mut labels, &mut next);
        update(&mut centroids, sample, &labels);
    }
    KMeans {
        centroids,
        iterations,
    }
}

/// Each centroid becomes the normalised mean of its rows; an empty list
/// takes the row farthest from its own centroid (each such row once).
fn update(c: &mut Centroids, sample: &[f32], labels: &[(u32, f32)]) {
    let dim = c.dim;
    let mut sums = vec![0f64; c.values.len()];
    let mut counts = vec![0u64; c.lists()];
    for (r, (l, _)) in sample.chunks_exact(dim).zip(labels) {
        let l = *l as usize;
        counts[l] += 1;
        for (s, x) in sums[l * dim..(l + 1) * dim].iter_mut().zip(r) {
            *s += f64::from(*x);
        }
    }
    let mut far: Vec<usize> = (0..labels.len()).collect();
    far.sort_by(|&a, &b| labels[a].1.total_cmp(&labels[b].1).then(a.cmp(&b)));
    let mut far = far.into_iter();
    for l in 0..counts.len() {
        let s = &mut sums[l * dim..(l + 1) * dim];
        let n = s.iter().map(|x| x * x).sum::<f64>().sqrt();
        if counts[l] == 0 || n == 0.0 || !n.is_finite() {
            if let Some(i) = far.next() {
                let r = &sample[i * dim..(i + 1) * dim];
                c.values[l * dim..(l + 1) * dim].copy_from_slice(r);
            }
            continue;
        }
        for (v, x) in c.values[l * dim..(l + 1) * dim].iter_mut().zip(s.iter()) {
            *v = (x / n) as f32;
        }
    }
}

// ---- centroids.parquet ---------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ivf::test_support::gen;
    use crate::kernels::{dot, nearest};

    #[test]
    fn nearest_is_the_argmax_of_dot_bit_for_bit_with_any_block_or_thread_split() {
        for dim in [3, 16, 17, 64, 100] {
            let rows = gen(1, 4099, dim, 7, 0.3);
            let cents = Centroids {
                dim,
                values: gen(2, 37, dim, 37, 0.0),
            };
            let mut out = vec![(0, 0.0); 4099];
            cents.nearest(&rows, &mut out);
            for (i, r) in rows.chunks_exact(dim).enumerate() {
                let d: Vec<f32> = cents.values.chunks_exact(dim).map(|c| dot(r, c)).collect();
                let best = (0..d.len()).fold(0, |b, l| if d[l] > d[b] { l } else { b });
                assert_eq!(out[i], (best as u32, d[best]), "dim {dim} row {i}");
            }
            let mut one = vec![(0, 0.0); 5];
            nearest(&cents.values, dim, &rows[7 * dim..12 * dim], &mut one);
            assert_eq!(&one[..], &out[7..12]);
        }
    }

    #[test]
    fn kmeans_finds_separated_clusters_and_is_deterministic() {
        let dim = 32;
        let rows = gen(3, 2000, dim, 10, 0.05);
        let a = kmeans(&rows, dim, 10, 7, 20);
        let b = kmeans(&rows, dim, 10, 7, 20);
        assert_eq!(a.centroids, b.centroids);
        let mut out = vec![(0, 0.0); 2000];
        a.centroids.nearest(&rows, &mut out);
        // Rows of one generating centre share a list, and the ten lists are distinct.
        for c in 0..10 {
            let l = out[c].0;
            assert!((c..2000).step_by(10).all(|i| out[i].0 == l), "centre {c}");
        }
        let mut lists: Vec<u32> = (0..10).map(|c| out[c].0).collect();
        lists.sort_unstable();
        lists.dedup();
        assert_eq!(lists.len(), 10);
        assert!(a.iterations < 20);
        for c in a.centroids.values.chunks_exact(dim) {
            let n: f32 = c.iter().map(|x| x * x).sum();
            assert!((n - 1.0).abs() < 1e-4);
        }
        assert_ne!(kmeans(&rows, dim, 10, 8, 20).centroids, a.centroids);
    }

    #[test]
    fn kmeans_of_identical_rows_leaves_no_nan() {
        let rows: Vec<f32> = [0.6f32, 0.8].repeat(50);
        let k = kmeans(&rows, 2, 5, 1, 5);
        assert!(k.centroids.values.iter().all(|v| v.is_finite()));
    }
}
