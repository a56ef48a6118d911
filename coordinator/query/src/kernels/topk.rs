//! The best `k` hits of a scan, and the scores made of a cosine.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::format::GroupRef;
use crate::Error;

/// A scored row: where it is, and its cosine with the query.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hit {
    /// Its row group.
    pub group: GroupRef,
    /// Row within the group.
    pub row: usize,
    /// Cosine with the query (both are unit vectors).
    pub cosine: f32,
}

impl Hit {
    /// Better first: higher cosine, then earlier in the index, so that equal
    /// scores rank the same way on every run.
    fn rank_cmp(&self, o: &Hit) -> Ordering {
        o.cosine
            .total_cmp(&self.cosine)
            .then_with(|| (self.group, self.row).cmp(&(o.group, o.row)))
    }
}

/// Max-heap order on "worse": the heap's top is the worst hit kept.
#[derive(Debug, Clone, Copy)]
struct Worst(Hit);

impl PartialEq for Worst {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Worst {}
impl PartialOrd for Worst {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Worst {
    fn cmp(&self, o: &Self) -> Ordering {
        self.0.rank_cmp(&o.0)
    }
}

/// The best `k` hits seen: O(k) memory, O(log k) per hit that enters.
#[derive(Debug, Clone, Default)]
pub struct TopK {
    k: usize,
    heap: BinaryHeap<Worst>,
}

impl TopK {
    /// An empty top-`k`.
    pub fn new(k: usize) -> TopK {
        TopK {
            k,
            heap: BinaryHeap::with_capacity(k.min(1 << 16) + 1),
        }
    }

    /// Offers a hit; cheap when it is worse than everything kept.
    #[inline]
    pub fn push(&mut self, h: Hit) {
        if self.k == 0 {
            return;
        }
        if self.heap.len() < self.k {
            self.heap.push(Worst(h));
        } else if let Some(top) = self.heap.peek() {
            if h.rank_cmp(&top.0) == Ordering::Less {
                self.heap.pop();
                self.heap.push(Worst(h));
            }
        }
    }

    /// The lowest cosine that still enters, once full: rows below it can be
    /// skipped without building a hit.
    #[inline]
    pub fn threshold(&self) -> f32 {
        if self.heap.len() < self.k {
            f32::NEG_INFINITY
        } else {
            self.heap.peek().map_or(f32::NEG_INFINITY, |w| w.0.cosine)
        }
    }

    /// Adds every hit of `other`.
    pub fn merge(&mut self, other: TopK) {
        for w in other.heap {
            self.push(w.0);
        }
    }

    /// The hits, best first.
    pub fn into_sorted(self) -> Vec<Hit> {
        let mut v: Vec<Hit> = self.heap.into_iter().map(|w| w.0).collect();
        v.sort_by(Hit::rank_cmp);
        v
    }
}

/// `sigmoid(exp(logit_scale) · cos + logit_bias)`: SigLIP's probability that
/// a text matches an image.
pub fn sigmoid_score(cos: f32, logit_scale: f64, logit_bias: f64) -> f64 {
    let z = logit_scale.exp() * f64::from(cos) + logit_bias;
    1.0 / (1.0 + (-z).exp())
}

/// Scales `v` to unit length; an error for a zero or non-finite vector.
pub fn normalize(v: &mut [f32]) -> Result<(), Error> {
    let n = v
        .iter()
        .map(|x| f64::from(*x) * f64::from(*x))
        .sum::<f64>()
        .sqrt();
    if !n.is_finite() || n == 0.0 {
        return Err(Error::ZeroVector);
    }
    for x in v {
        *x = (f64::from(*x) / n) as f32;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(part: usize, row: usize, cosine: f32) -> Hit {
        Hit {
            group: GroupRef { part, row_group: 0 },
            row,
            cosine,
        }
    }

    #[test]
    fn top_k_keeps_the_best_and_breaks_ties_by_position() {
        let mut t = TopK::new(3);
        for (i, c) in [0.1, 0.9, 0.5, 0.9, 0.3, 0.7].iter().enumerate() {
            t.push(hit(0, i, *c));
        }
        let v = t.into_sorted();
        let got: Vec<(usize, f32)> = v.iter().map(|h| (h.row, h.cosine)).collect();
        assert_eq!(got, vec![(1, 0.9), (3, 0.9), (5, 0.7)]);
    }

    #[test]
    fn merged_top_ks_equal_one_over_everything() {
        let cos: Vec<f32> = (0..200).map(|i| ((i * 37) % 101) as f32 / 101.0).collect();
        let mut all = TopK::new(10);
        let (mut a, mut b) = (TopK::new(10), TopK::new(10));
        for (i, c) in cos.iter().enumerate() {
            all.push(hit(0, i, *c));
            if i % 2 == 0 {
                a.push(hit(0, i, *c))
            } else {
                b.push(hit(0, i, *c))
            }
        }
        a.merge(b);
        assert_eq!(a.into_sorted(), all.into_sorted());
    }

    #[test]
    fn scores_are_siglip_sigmoids() {
        let s = sigmoid_score(0.5, 10f64.ln(), -10.0);
        assert!((s - 1.0 / (1.0 + (5.0f64).exp())).abs() < 1e-12);
    }
}
