//! The part of a resize that depends only on its sizes, kept for the next call.

use std::cell::RefCell;
use std::rc::Rc;

#[cfg(target_arch = "x86_64")]
use super::x86;
use super::{precompute_coeffs, Coeffs, Filter};

/// What a resize computes before it touches pixels: the pass order and both
/// axes' taps. It depends only on the sizes, channels and filter, and a
/// worker resizes every image to one size, so the last one is kept per thread.
pub(super) struct Plan {
    pub(super) key: PlanKey,
    pub(super) horizontal_first: bool,
    /// Horizontal first: the source rows the vertical pass reads, which are
    /// all the horizontal pass needs to produce (`vert` counts from `rows.0`).
    pub(super) rows: (usize, usize),
    pub(super) horiz: Coeffs,
    pub(super) vert: Coeffs,
    #[cfg(target_arch = "x86_64")]
    pub(super) fast: x86::Tables,
}

/// Everything a [`Plan`] depends on.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct PlanKey {
    pub(super) sw: usize,
    pub(super) sh: usize,
    pub(super) dw: usize,
    pub(super) dh: usize,
    pub(super) channels: usize,
    pub(super) filter: Filter,
    /// Whether the vector passes may run (tests compare them with the scalar ones).
    pub(super) simd: bool,
}

impl Plan {
    pub(super) fn new(key: PlanKey) -> Plan {
        let PlanKey { sw, sh, dw, dh, .. } = key;
        let (sw_i, sh_i, dw_i, dh_i) = (sw as i64, sh as i64, dw as i64, dh as i64);
        // Pillow 13: shrinking the height a lot makes the vertical pass first
        // cheaper. It also changes which intermediate gets rounded to 8 bits.
        let horizontal_first = !(sh_i - dh_i > 0 && sh_i - dh_i > (sw_i - dw_i) * 2);
        let mut vert = precompute_coeffs(sh, dh, key.filter);
        let mut rows = (0, sh);
        if horizontal_first && dw != sw {
            // Only the source rows the vertical pass reads get resampled.
            let first = vert.bounds[0].0;
            let (last_min, last_n) = vert.bounds[dh - 1];
            rows = (first, last_min + last_n);
            for b in &mut vert.bounds {
                b.0 -= first;
            }
        }
        let horiz = precompute_coeffs(sw, dw, key.filter);
        #[cfg(target_arch = "x86_64")]
        let fast = {
            let ch = key.channels;
            let vert_row = ch * if horizontal_first { dw } else { sw };
            let h = (dw != sw).then_some((&horiz, ch, dw));
            let v = (dh != sh).then_some((&vert, vert_row));
            if key.simd {
                x86::Tables::new(h, v)
            } else {
                x86::Tables::default()
            }
        };
        Plan {
            key,
            horizontal_first,
            rows,
            horiz,
            vert,
            #[cfg(target_arch = "x86_64")]
            fast,
        }
    }

    /// Bytes the horizontal pass writes for `rows` rows of `out_stride`:
    /// the vector code stores whole vectors, past the last pixel.
    pub(super) fn horizontal_len(&self, rows: usize, out_stride: usize) -> usize {
        #[cfg(target_arch = "x86_64")]
        if let Some(t) = &self.fast.horiz {
            return t.out_len(rows, out_stride);
        }
        rows * out_stride
    }

    /// This thread's last plan if it is for `key`, else a new one.
    pub(super) fn get(key: PlanKey) -> Rc<Plan> {
        thread_local! {
            static LAST: RefCell<Option<Rc<Plan>>> = const { RefCell::new(None) };
        }
        LAST.with(|last| {
            let mut last = last.borrow_mut();
            match &*last {
                Some(p) if p.key == key => p.clone(),
                _ => {
                    let p = Rc::new(Plan::new(key));
                    *last = Some(p.clone());
                    p
                }
            }
        })
    }
}
