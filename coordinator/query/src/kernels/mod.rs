//! The arithmetic of the query side: dot products over stored embedding
//! values, the nearest centroid of a row, and the best `k` hits.
//!
//! Every kernel runs through `dispatch`, the one place that picks an
//! instruction set: the kernels are written once, for the autovectoriser,
//! and `dispatch` compiles them a second time with AVX2 and FMA where the CPU
//! has them. Rust never contracts a multiply and an add into an FMA, so both
//! builds give the same results bit for bit.

mod dot;
mod rows;
mod topk;

pub use dot::{
    dot, dot4, dots, dots4, dots4_scaled, dots_scaled, inv_norms, inv_norms_i8, nearest,
};
pub use topk::{normalize, sigmoid_score, Hit, TopK};

#[cfg(target_arch = "x86_64")]
use std::sync::OnceLock;

/// Runs `f` with the best instruction set this CPU has: inlined into a
/// function compiled for AVX2 and FMA when the CPU has both, as it is
/// otherwise. `f` and what it calls must be `#[inline(always)]` to be
/// compiled for the wider lanes.
#[inline(always)]
pub(crate) fn dispatch<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA, checked by `avx2_fma`.
        return unsafe { with_avx2_fma(f) };
    }
    f()
}

/// Whether the CPU has AVX2 and FMA, asked once.
#[cfg(target_arch = "x86_64")]
fn avx2_fma() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
    })
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn with_avx2_fma<R>(f: impl FnOnce() -> R) -> R {
    // The same code, compiled with 256-bit lanes: a kernel's 16-wide
    // accumulator becomes two ymm registers.
    f()
}

/// A stored embedding value as the kernels read it: float32 in memory, float32
/// as the little-endian bytes of a Parquet page (any alignment: a page's values
/// start wherever its levels end), or int8. Every kernel is generic over it, so
/// the three share one set of lanes and one reduction order.
pub trait Lane: Copy {
    /// The value as float32.
    fn f32(self) -> f32;
}

impl Lane for f32 {
    #[inline(always)]
    fn f32(self) -> f32 {
        self
    }
}

impl Lane for [u8; 4] {
    #[inline(always)]
    fn f32(self) -> f32 {
        f32::from_le_bytes(self)
    }
}

impl Lane for i8 {
    #[inline(always)]
    fn f32(self) -> f32 {
        f32::from(self)
    }
}

impl Lane for [u8; 2] {
    #[inline(always)]
    fn f32(self) -> f32 {
        f16_bits_to_f32(u16::from_le_bytes(self))
    }
}

impl Lane for half::f16 {
    #[inline(always)]
    fn f32(self) -> f32 {
        f16_bits_to_f32(self.to_bits())
    }
}

/// IEEE binary16 to binary32, exactly, in branch-free integer and float
/// operations the autovectoriser keeps in vector lanes (the `half` crate's
/// conversion is a call per value unless the build targets F16C): the
/// exponent and mantissa shifted into place are the value scaled by 2⁻¹¹²
/// (subnormals included, as binary32 subnormals), so one multiply rescales
/// them; infinities and NaNs get binary32's all-ones exponent.
#[inline(always)]
fn f16_bits_to_f32(h: u16) -> f32 {
    let h = u32::from(h);
    let sign = (h & 0x8000) << 16;
    let em = h & 0x7fff;
    let v = f32::from_bits(em << 13) * f32::from_bits(0x7780_0000);
    let special = if em >= 0x7c00 {
        0x7f80_0000 | (em << 13)
    } else {
        v.to_bits()
    };
    f32::from_bits(sign | special)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_bits_widen_as_the_half_crate_widens_them() {
        for h in 0..=u16::MAX {
            let want = half::f16::from_bits(h).to_f32();
            let got = f16_bits_to_f32(h);
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{h:#06x}: {got} != {want}"
            );
            assert_eq!(got.to_bits(), h.to_le_bytes().f32().to_bits());
        }
    }
}
