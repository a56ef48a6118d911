//! Undoing TIFF predictors in place on decoded block bytes.

use super::TiffError;

/// Undoes predictor 2 (horizontal differencing) on integer words of `size` bytes.
///
/// Works on the raw words in file byte order, so it also serves float data that a
/// writer (libtiff allows it) differenced as integers.
pub(crate) fn horizontal(
    buf: &mut [u8],
    row_samples: usize,
    spp: usize,
    size: usize,
    big_endian: bool,
) {
    let row_bytes = row_samples * size;
    if row_bytes == 0 {
        return;
    }
    for row in buf.chunks_exact_mut(row_bytes) {
        match size {
            1 => {
                for i in spp..row.len() {
                    row[i] = row[i].wrapping_add(row[i - spp]);
                }
            }
            2 | 4 | 8 => {
                for i in spp..row_samples {
                    let a = get(row, (i - spp) * size, size, big_endian);
                    let b = get(row, i * size, size, big_endian);
                    put(row, i * size, size, big_endian, a.wrapping_add(b));
                }
            }
            _ => {}
        }
    }
}

fn get(b: &[u8], at: usize, size: usize, be: bool) -> u64 {
    let mut v = 0u64;
    for k in 0..size {
        let byte = if be { b[at + k] } else { b[at + size - 1 - k] };
        v = (v << 8) | byte as u64;
    }
    v
}

fn put(b: &mut [u8], at: usize, size: usize, be: bool, v: u64) {
    for k in 0..size {
        let byte = (v >> (8 * (size - 1 - k))) as u8;
        if be {
            b[at + k] = byte;
        } else {
            b[at + size - 1 - k] = byte;
        }
    }
}

/// Undoes predictor 3 (floating point): byte differencing over a row whose
/// sample bytes are stored as planes, most significant byte first. The result
/// is written back in the file's byte order.
pub(crate) fn floating(
    buf: &mut [u8],
    row_samples: usize,
    spp: usize,
    size: usize,
    big_endian: bool,
) -> Result<(), TiffError> {
    let row_bytes = row_samples * size;
    if row_bytes == 0 {
        return Ok(());
    }
    if !buf.len().is_multiple_of(row_bytes) {
        return Err(TiffError::malformed(
            "floating-point predictor: block is not whole rows",
        ));
    }
    let mut tmp = vec![0u8; row_bytes];
    for row in buf.chunks_exact_mut(row_bytes) {
        for i in spp..row.len() {
            row[i] = row[i].wrapping_add(row[i - spp]);
        }
        tmp.copy_from_slice(row);
        for s in 0..row_samples {
            for k in 0..size {
                let byte = tmp[k * row_samples + s];
                let at = if big_endian {
                    s * size + k
                } else {
                    s * size + size - 1 - k
                };
                row[at] = byte;
            }
        }
    }
    Ok(())
}
