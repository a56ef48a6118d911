//! Chroma upsampling as selected and performed by libjpeg-turbo's
//! `jdsample.c` with `do_fancy_upsampling` on (the library default).
//!
//! Vertical context follows `jdmainct.c`: the row above the first row is the
//! first row itself and rows past `downsampled_height` repeat the last real
//! row, so neighbours are simply clamped.

use super::error::Error;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Method {
    Full,
    H2V1Fancy,
    H1V2Fancy,
    H2V2Fancy,
    /// `h2v1_upsample`, `h2v2_upsample` and `int_upsample`: pixel replication.
    Replicate {
        hx: usize,
        vx: usize,
    },
}

/// Mirrors `jinit_upsampler`. Fancy 2:1 horizontal filters need a left and a
/// right neighbour, hence libjpeg's `downsampled_width > 2` condition; the
/// h1v2 filter has no such condition.
pub(crate) fn choose(
    h: usize,
    v: usize,
    max_h: usize,
    max_v: usize,
    downsampled_width: usize,
) -> Result<Method, Error> {
    Ok(if h == max_h && v == max_v {
        Method::Full
    } else if h * 2 == max_h && v == max_v {
        if downsampled_width > 2 {
            Method::H2V1Fancy
        } else {
            Method::Replicate { hx: 2, vx: 1 }
        }
    } else if h == max_h && v * 2 == max_v {
        Method::H1V2Fancy
    } else if h * 2 == max_h && v * 2 == max_v {
        if downsampled_width > 2 {
            Method::H2V2Fancy
        } else {
            Method::Replicate { hx: 2, vx: 2 }
        }
    } else if max_h.is_multiple_of(h) && max_v.is_multiple_of(v) {
        Method::Replicate {
            hx: max_h / h,
            vx: max_v / v,
        }
    } else {
        return Err(Error::Unsupported(
            "non-integral chroma sampling ratio".into(),
        ));
    })
}

/// Source row(s) for output row `y`: `(nearest, next_nearest, below)`, where
/// `below` says whether the next-nearest row is the one below.
#[inline]
pub(crate) fn vertical_pair(y: usize, downsampled_height: usize) -> (usize, usize, bool) {
    let r = y / 2;
    if y.is_multiple_of(2) {
        (r, r.saturating_sub(1), false)
    } else {
        (r, (r + 1).min(downsampled_height - 1), true)
    }
}

/// `h2v1_fancy_upsample`; `out` must hold `2 * inp.len()` samples and
/// `inp.len() > 2`.
pub(crate) fn h2v1_fancy(inp: &[u8], out: &mut [u8]) {
    let n = inp.len();
    let out = &mut out[..2 * n];
    let first = i32::from(inp[0]);
    out[0] = inp[0];
    out[1] = ((first * 3 + i32::from(inp[1]) + 2) >> 2) as u8;
    for (i, o) in out[2..2 * n - 2].chunks_exact_mut(2).enumerate() {
        let cur = i32::from(inp[i + 1]) * 3;
        o[0] = ((cur + i32::from(inp[i]) + 1) >> 2) as u8;
        o[1] = ((cur + i32::from(inp[i + 2]) + 2) >> 2) as u8;
    }
    let last = i32::from(inp[n - 1]);
    out[2 * n - 2] = ((last * 3 + i32::from(inp[n - 2]) + 1) >> 2) as u8;
    out[2 * n - 1] = inp[n - 1];
}

/// `h1v2_fancy_upsample` for one output row; `bias` is 1 when the
/// next-nearest row is above and 2 when it is below.
pub(crate) fn h1v2_fancy(near: &[u8], far: &[u8], below: bool, out: &mut [u8]) {
    let bias = if below { 2 } else { 1 };
    for ((o, &a), &b) in out.iter_mut().zip(near).zip(far) {
        *o = ((i32::from(a) * 3 + i32::from(b) + bias) >> 2) as u8;
    }
}

/// `h2v2_fancy_upsample` for one output row; `near.len() > 2`, `far` at
/// least as long, `out` holds `2 * near.len()`.
pub(crate) fn h2v2_fancy(near: &[u8], far: &[u8], out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 support was verified at run time just above.
        return unsafe { h2v2_fancy_avx2(near, far, out) };
    }
    h2v2_fancy_portable(near, far, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn h2v2_fancy_avx2(near: &[u8], far: &[u8], out: &mut [u8]) {
    h2v2_fancy_portable(near, far, out)
}

/// libjpeg carries running column sums; recomputing the three sums each
/// output pair needs is the same arithmetic without the loop-carried
/// dependency, so it vectorises.
#[inline(always)]
fn h2v2_fancy_portable(near: &[u8], far: &[u8], out: &mut [u8]) {
    let n = near.len();
    let far = &far[..n];
    let out = &mut out[..2 * n];
    let colsum = |i: usize| i32::from(near[i]) * 3 + i32::from(far[i]);
    let first = colsum(0);
    out[0] = ((first * 4 + 8) >> 4) as u8;
    out[1] = ((first * 3 + colsum(1) + 7) >> 4) as u8;
    let sums = |k: usize| near[k..n - 2 + k].iter().zip(&far[k..n - 2 + k]);
    for (((o, (&nl, &fl)), (&nt, &ft)), (&nn, &fnx)) in out[2..2 * n - 2]
        .chunks_exact_mut(2)
        .zip(sums(0))
        .zip(sums(1))
        .zip(sums(2))
    {
        let last = i32::from(nl) * 3 + i32::from(fl);
        let this = i32::from(nt) * 3 + i32::from(ft);
        let next = i32::from(nn) * 3 + i32::from(fnx);
        o[0] = ((this * 3 + last + 8) >> 4) as u8;
        o[1] = ((this * 3 + next + 7) >> 4) as u8;
    }
    let this = colsum(n - 1);
    out[2 * n - 2] = ((this * 3 + colsum(n - 2) + 8) >> 4) as u8;
    out[2 * n - 1] = ((this * 4 + 7) >> 4) as u8;
}

/// Box replication by `hx` horizontally; fills all of `out`.
pub(crate) fn replicate(inp: &[u8], hx: usize, out: &mut [u8]) {
    if hx == 1 {
        out.copy_from_slice(&inp[..out.len()]);
        return;
    }
    for (o, &v) in out.chunks_mut(hx).zip(inp) {
        o.fill(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selection_matches_libjpeg_rules() {
        assert_eq!(choose(2, 2, 2, 2, 8).unwrap(), Method::Full);
        assert_eq!(choose(1, 1, 2, 2, 3).unwrap(), Method::H2V2Fancy);
        assert_eq!(
            choose(1, 1, 2, 2, 2).unwrap(),
            Method::Replicate { hx: 2, vx: 2 }
        );
        assert_eq!(choose(1, 1, 2, 1, 3).unwrap(), Method::H2V1Fancy);
        assert_eq!(choose(1, 1, 1, 2, 1).unwrap(), Method::H1V2Fancy);
        assert_eq!(
            choose(1, 1, 4, 1, 9).unwrap(),
            Method::Replicate { hx: 4, vx: 1 }
        );
        assert!(choose(2, 1, 3, 1, 9).is_err());
    }
}
