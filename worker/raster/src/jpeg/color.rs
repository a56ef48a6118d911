//! `jdcolor.c ycc_rgb_convert` with libjpeg's fixed-point tables.

const SCALEBITS: u32 = 16;
const ONE_HALF: i32 = 1 << (SCALEBITS - 1);

/// `FIX(x)` rounded at compile time: 1.40200, 1.77200, 0.71414, 0.34414.
const FIX_1_40200: i32 = 91881;
const FIX_1_77200: i32 = 116130;
const FIX_0_71414: i32 = 46802;
const FIX_0_34414: i32 = 22554;

pub(crate) struct YccTables {
    cr_r: [i32; 256],
    cb_b: [i32; 256],
    cr_g: [i32; 256],
    cb_g: [i32; 256],
}

impl YccTables {
    pub(crate) fn new() -> YccTables {
        let mut t = YccTables {
            cr_r: [0; 256],
            cb_b: [0; 256],
            cr_g: [0; 256],
            cb_g: [0; 256],
        };
        for i in 0..256 {
            let x = i as i32 - 128;
            t.cr_r[i] = (FIX_1_40200 * x + ONE_HALF) >> SCALEBITS;
            t.cb_b[i] = (FIX_1_77200 * x + ONE_HALF) >> SCALEBITS;
            t.cr_g[i] = -FIX_0_71414 * x;
            // ONE_HALF folded in here, as libjpeg does, so G rounds correctly.
            t.cb_g[i] = -FIX_0_34414 * x + ONE_HALF;
        }
        t
    }

    /// Converts one row into interleaved RGB; `out.len() == 3 * width`.
    pub(crate) fn convert_row(&self, y: &[u8], cb: &[u8], cr: &[u8], out: &mut [u8]) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 support was verified at run time just above.
            return unsafe { self.convert_row_avx2(y, cb, cr, out) };
        }
        self.convert_row_portable(y, cb, cr, out)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn convert_row_avx2(&self, y: &[u8], cb: &[u8], cr: &[u8], out: &mut [u8]) {
        self.convert_row_portable(y, cb, cr, out)
    }

    #[inline(always)]
    fn convert_row_portable(&self, y: &[u8], cb: &[u8], cr: &[u8], out: &mut [u8]) {
        let w = out.len() / 3;
        for (((o, &y), &cb), &cr) in out
            .chunks_exact_mut(3)
            .zip(&y[..w])
            .zip(&cb[..w])
            .zip(&cr[..w])
        {
            let y = i32::from(y);
            let (cb, cr) = (usize::from(cb), usize::from(cr));
            // y + table term stays in -179..=434, where libjpeg's
            // sample_range_limit is a plain clamp.
            o[0] = (y + self.cr_r[cr]).clamp(0, 255) as u8;
            o[1] = (y + ((self.cb_g[cb] + self.cr_g[cr]) >> SCALEBITS)).clamp(0, 255) as u8;
            o[2] = (y + self.cb_b[cb]).clamp(0, 255) as u8;
        }
    }
}

/// Interleaves three planes unchanged (libjpeg's RGB passthrough and the
/// raw output libtiff asks for with `JCS_UNKNOWN`).
pub(crate) fn interleave_row(a: &[u8], b: &[u8], c: &[u8], out: &mut [u8]) {
    let w = out.len() / 3;
    for (((o, &a), &b), &c) in out
        .chunks_exact_mut(3)
        .zip(&a[..w])
        .zip(&b[..w])
        .zip(&c[..w])
    {
        o[0] = a;
        o[1] = b;
        o[2] = c;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neutral_chroma_is_grey() {
        let t = YccTables::new();
        let mut out = [0u8; 9];
        t.convert_row(&[0, 128, 255], &[128; 3], &[128; 3], &mut out);
        assert_eq!(out, [0, 0, 0, 128, 128, 128, 255, 255, 255]);
    }
}
