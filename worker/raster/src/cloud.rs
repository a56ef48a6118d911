//! Cloud masks: which pixels of a `--cloud-mask` asset are cloud, and the
//! share of a chip's valid pixels they cover.
//!
//! The mask is read like any band file (the same TIFF reader and limits, the
//! same grid rules, nearest neighbour from a coarser grid), but it is no
//! channel: it only gives each chip its `cloud_fraction`.

use rsembed_schemas::task::MaskKind;

/// Sentinel-2 L2A scene classes that count as cloud: 3 cloud shadow, 8 and 9
/// cloud (medium and high probability), 10 thin cirrus.
pub const SCL_CLOUD_CLASSES: [u8; 4] = [3, 8, 9, 10];

/// Landsat Collection 2 `QA_PIXEL` bits that count as cloud: 1 dilated cloud,
/// 2 cirrus, 3 cloud, 4 cloud shadow.
pub const QA_PIXEL_CLOUD_BITS: u32 = 0b1_1110;

/// `QA_PIXEL` bit 0: fill, a pixel without data, never cloud whatever its other bits say.
const QA_PIXEL_FILL: u32 = 0b1;

/// Whether a mask sample `v` marks cloud.
///
/// Samples that are not whole, non-negative numbers a mask of that kind can
/// hold (a float mask, a negative value) are not cloud: the mask is not what
/// it claims to be there, and calling it cloud would drop chips for nothing.
/// SCL class 0 (no data) and `QA_PIXEL` fill are never cloud.
pub fn is_cloud(kind: MaskKind, v: f64) -> bool {
    if !(v >= 0.0 && v.fract() == 0.0 && v <= f64::from(u32::MAX)) {
        return false;
    }
    let v = v as u32;
    match kind {
        MaskKind::Scl => u8::try_from(v).is_ok_and(|c| SCL_CLOUD_CLASSES.contains(&c)),
        MaskKind::QaPixel => v & QA_PIXEL_FILL == 0 && v & QA_PIXEL_CLOUD_BITS != 0,
    }
}

/// Counts of one chip: its valid pixels, and those of them the mask marks as cloud.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CloudCount {
    /// Valid pixels of the chip (as `valid_fraction` counts them).
    pub valid: u64,
    /// Valid pixels that are cloud.
    pub cloud: u64,
}

impl CloudCount {
    /// Adds one pixel of the chip.
    pub fn add(&mut self, valid: bool, cloud: bool) {
        if valid {
            self.valid += 1;
            self.cloud += u64::from(cloud);
        }
    }

    /// `cloud / valid`; `None` for a chip without a valid pixel (it is not
    /// written anyway).
    pub fn fraction(&self) -> Option<f32> {
        (self.valid > 0).then(|| (self.cloud as f64 / self.valid as f64) as f32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scl_classes_3_8_9_10_are_cloud() {
        let cloud: Vec<u32> = (0..=255)
            .filter(|v| is_cloud(MaskKind::Scl, f64::from(*v)))
            .collect();
        assert_eq!(cloud, [3, 8, 9, 10]);
        assert!(!is_cloud(MaskKind::Scl, 0.0), "no data is never cloud");
        assert!(!is_cloud(MaskKind::Scl, 8.5));
        assert!(!is_cloud(MaskKind::Scl, -8.0));
        assert!(!is_cloud(MaskKind::Scl, f64::NAN));
        assert!(!is_cloud(MaskKind::Scl, 256.0 + 8.0), "no wrap-around");
    }

    #[test]
    fn qa_pixel_bits_1_to_4_are_cloud_unless_fill() {
        // Real Landsat C2 values: 21824 clear land, 21952 clear water,
        // 22280 high-confidence cloud, 23888 cloud shadow, 55052 cirrus,
        // 1 fill, 21890 dilated cloud.
        let q = |v: u32| is_cloud(MaskKind::QaPixel, f64::from(v));
        assert!(!q(21824) && !q(21952));
        assert!(q(22280) && q(23888) && q(55052) && q(21890));
        assert!(!q(1), "fill");
        assert!(!q(0b1_1111), "fill wins over the cloud bits");
        for bit in 1..=4 {
            assert!(q(1 << bit), "bit {bit}");
        }
        for bit in 5..16 {
            assert!(!q(1 << bit), "bit {bit}");
        }
    }

    #[test]
    fn fraction_is_over_valid_pixels_only() {
        let mut c = CloudCount::default();
        for (valid, cloud) in [(true, true), (true, false), (false, true), (true, true)] {
            c.add(valid, cloud);
        }
        assert_eq!(c, CloudCount { valid: 3, cloud: 2 });
        assert_eq!(c.fraction(), Some(2.0 / 3.0));
        assert_eq!(CloudCount::default().fraction(), None);
    }
}
