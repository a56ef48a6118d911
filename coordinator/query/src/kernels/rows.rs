//! Rows of an `embedding` column as unit float32 values.

use rsembed_schemas::embedding::dequantize_int8;

use super::{dot, normalize};
use crate::format::Embeddings;

impl<'a> Embeddings<'a> {
    /// Every row as unit float32 values: the column itself for f32, a
    /// decoded copy otherwise (int8's scale cancels in the normalisation).
    pub fn unit_rows(self, dim: usize) -> std::borrow::Cow<'a, [f32]> {
        let mut out = match self {
            Embeddings::F32(rows) => return std::borrow::Cow::Borrowed(rows),
            Embeddings::F16(rows) => {
                let mut out = vec![0f32; rows.len()];
                half::slice::HalfFloatSliceExt::convert_to_f32_slice(rows, &mut out);
                out
            }
            Embeddings::Int8 { values, .. } => values.iter().map(|v| f32::from(*v)).collect(),
        };
        for row in out.chunks_exact_mut(dim) {
            let n = dot(row, row);
            if n > 0.0 {
                let inv = 1.0 / n.sqrt();
                row.iter_mut().for_each(|x| *x *= inv);
            }
        }
        std::borrow::Cow::Owned(out)
    }

    /// Row `i` as float32 values (dequantised), unit length.
    pub fn row(&self, i: usize, dim: usize) -> Vec<f32> {
        let r = i * dim..(i + 1) * dim;
        let mut v: Vec<f32> = match *self {
            Embeddings::F32(rows) => return rows[r].to_vec(),
            Embeddings::F16(rows) => rows[r].iter().map(|x| x.to_f32()).collect(),
            Embeddings::Int8 { values, scales } => {
                let mut v = vec![0f32; dim];
                dequantize_int8(&values[r], scales[i], &mut v);
                v
            }
        };
        // A zero row stays zero: its cosine with anything is 0.
        let _ = normalize(&mut v);
        v
    }
}
