//! How the `embedding` column stores a vector: `--embedding-type f32|f16|int8`.
//!
//! f32 is the model's output as it is. f16 halves it, at a cosine error of
//! about 1e-3 of the value's last digits. int8 quarters it with symmetric
//! scalar quantisation, one scale per vector (`embedding_scale`):
//!
//! ```text
//! s = max_i |x_i| / 127        e_i = round(x_i / s)  in [-127, 127]
//! x_i ≈ e_i · s
//! ```
//!
//! Per-vector scale was measured against per-dimension scales, a fixed
//! 1/127 and AlphaEarth's signed square root before it was chosen
//! (docs/decisions.md, "int8 embeddings"; `bench/quant.py`). The
//! dequantised vector is not unit length; its cosine with a query is its dot
//! product divided by its norm, which search computes.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The column holding an int8 row's scale.
pub const SCALE_COLUMN: &str = "embedding_scale";

/// The stored type of `embedding`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EmbeddingType {
    /// FixedSizeList<Float32, D>: the model's output.
    #[default]
    F32,
    /// FixedSizeList<Float16, D> (Parquet FLOAT16).
    F16,
    /// FixedSizeList<Int8, D> and a Float32 `embedding_scale` per row.
    Int8,
}

impl EmbeddingType {
    /// The Arrow type of an `embedding` column of `dim` values stored as
    /// this type: a fixed-size list of non-null `item`s.
    #[cfg(feature = "arrow")]
    pub fn arrow_type(self, dim: usize) -> arrow_schema::DataType {
        use arrow_schema::{DataType, Field};
        let item = match self {
            EmbeddingType::F32 => DataType::Float32,
            EmbeddingType::F16 => DataType::Float16,
            EmbeddingType::Int8 => DataType::Int8,
        };
        DataType::FixedSizeList(
            std::sync::Arc::new(Field::new("item", item, false)),
            i32::try_from(dim).expect("embedding dimension fits in i32"),
        )
    }

    /// Every type, in flag order.
    pub const ALL: [EmbeddingType; 3] =
        [EmbeddingType::F32, EmbeddingType::F16, EmbeddingType::Int8];

    /// The flag value.
    pub fn as_str(self) -> &'static str {
        match self {
            EmbeddingType::F32 => "f32",
            EmbeddingType::F16 => "f16",
            EmbeddingType::Int8 => "int8",
        }
    }

    /// Whether this is the default, which job specs leave out (so that the
    /// jobs of earlier versions keep their ids).
    pub fn is_f32(&self) -> bool {
        *self == EmbeddingType::F32
    }

    /// Bytes of one stored element.
    pub fn element_bytes(self) -> usize {
        match self {
            EmbeddingType::F32 => 4,
            EmbeddingType::F16 => 2,
            EmbeddingType::Int8 => 1,
        }
    }

    /// How to get float32 values back, as recorded in the `rsembed` file
    /// metadata and as `emb:quantization` in the STAC output; `None` for f32.
    pub fn quantization(self) -> Option<Quantization> {
        match self {
            EmbeddingType::F32 => None,
            EmbeddingType::F16 => Some(Quantization {
                data_type: "float16".into(),
                method: "IEEE 754 half precision, round to nearest even".into(),
                scale_column: None,
                dequantize: "embedding[i]".into(),
            }),
            EmbeddingType::Int8 => Some(Quantization {
                data_type: "int8".into(),
                method: "symmetric scalar quantisation, one scale per vector: \
                         embedding_scale = max(|x|) / 127, embedding[i] = round(x[i] / embedding_scale)"
                    .into(),
                scale_column: Some(SCALE_COLUMN.into()),
                dequantize: "embedding[i] * embedding_scale".into(),
            }),
        }
    }
}

impl fmt::Display for EmbeddingType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for EmbeddingType {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" => Ok(EmbeddingType::F32),
            "f16" | "float16" => Ok(EmbeddingType::F16),
            "int8" | "i8" => Ok(EmbeddingType::Int8),
            _ => Err(format!("`{s}`: expected f32, f16 or int8")),
        }
    }
}

/// The dequantisation of a stored embedding, for readers that are not rsembed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quantization {
    /// The element type: `float16` or `int8`.
    pub data_type: String,
    /// How the values were made from the model's float32 output.
    pub method: String,
    /// The per-row scale column, for int8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_column: Option<String>,
    /// The float32 value of element `i`.
    pub dequantize: String,
}

/// Quantises `x` to `out` (same length) and returns the scale `s`, with
/// `x[i] ≈ out[i] · s`. Non-finite values count as 0 (a model never gives
/// them; a hostile file could), and a zero vector has scale 0.
pub fn quantize_int8(x: &[f32], out: &mut [i8]) -> f32 {
    assert_eq!(x.len(), out.len(), "quantize_int8: lengths");
    let max = x
        .iter()
        .filter(|v| v.is_finite())
        .fold(0f32, |m, v| m.max(v.abs()));
    if max == 0.0 {
        out.fill(0);
        return 0.0;
    }
    let s = max / 127.0;
    let inv = 127.0 / max;
    for (o, v) in out.iter_mut().zip(x) {
        let v = if v.is_finite() { *v } else { 0.0 };
        // The clamp guards the rounding of the largest element only.
        *o = (v * inv).round().clamp(-127.0, 127.0) as i8;
    }
    s
}

/// `out[i] = e[i] · s`.
pub fn dequantize_int8(e: &[i8], s: f32, out: &mut [f32]) {
    for (o, v) in out.iter_mut().zip(e) {
        *o = f32::from(*v) * s;
    }
}

/// Builds an `embedding` column of one stored type from float32 vectors
/// (and, for int8, the `embedding_scale` column).
#[cfg(feature = "arrow")]
pub struct EmbeddingBuilder {
    ty: EmbeddingType,
    dim: usize,
    f32s: Vec<f32>,
    f16s: Vec<half::f16>,
    i8s: Vec<i8>,
    scales: Vec<f32>,
    rows: usize,
}

#[cfg(feature = "arrow")]
impl EmbeddingBuilder {
    /// A builder for about `rows` vectors of `dim`.
    pub fn new(ty: EmbeddingType, dim: usize, rows: usize) -> EmbeddingBuilder {
        let cap = |t: EmbeddingType| if ty == t { rows * dim } else { 0 };
        EmbeddingBuilder {
            ty,
            dim,
            f32s: Vec::with_capacity(cap(EmbeddingType::F32)),
            f16s: Vec::with_capacity(cap(EmbeddingType::F16)),
            i8s: Vec::with_capacity(cap(EmbeddingType::Int8)),
            scales: Vec::new(),
            rows: 0,
        }
    }

    /// Appends one vector of `dim` floats.
    pub fn append(&mut self, v: &[f32]) {
        assert_eq!(
            v.len(),
            self.dim,
            "embedding of the wrong size: this is a bug"
        );
        match self.ty {
            EmbeddingType::F32 => self.f32s.extend_from_slice(v),
            EmbeddingType::F16 => self.f16s.extend(v.iter().map(|x| half::f16::from_f32(*x))),
            EmbeddingType::Int8 => {
                let start = self.i8s.len();
                self.i8s.resize(start + self.dim, 0);
                let s = quantize_int8(v, &mut self.i8s[start..]);
                self.scales.push(s);
            }
        }
        self.rows += 1;
    }

    /// The `embedding` column, and the `embedding_scale` column for int8.
    pub fn finish(self) -> (arrow_array::ArrayRef, Option<arrow_array::ArrayRef>) {
        use std::sync::Arc;

        use arrow_array::{
            Array, ArrayRef, FixedSizeListArray, Float16Array, Float32Array, Int8Array,
        };
        let dim = i32::try_from(self.dim).expect("embedding dimension fits in i32");
        let (values, scale): (ArrayRef, Option<ArrayRef>) = match self.ty {
            EmbeddingType::F32 => (Arc::new(Float32Array::from(self.f32s)), None),
            EmbeddingType::F16 => (Arc::new(Float16Array::from(self.f16s)), None),
            EmbeddingType::Int8 => (
                Arc::new(Int8Array::from(self.i8s)),
                Some(Arc::new(Float32Array::from(self.scales)) as ArrayRef),
            ),
        };
        let item = match self.ty.arrow_type(self.dim) {
            arrow_schema::DataType::FixedSizeList(item, _) => item,
            _ => unreachable!("embedding_type_of is a fixed-size list"),
        };
        let list = FixedSizeListArray::new(item, dim, values, None);
        debug_assert_eq!(list.len(), self.rows);
        (Arc::new(list), scale)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int8_round_trip_is_within_half_a_step() {
        let x: Vec<f32> = (0..64).map(|i| ((i as f32) * 0.37).sin() / 8.0).collect();
        let mut e = vec![0i8; 64];
        let s = quantize_int8(&x, &mut e);
        let max = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!((s - max / 127.0).abs() < 1e-9);
        assert!(e.iter().any(|v| v.abs() == 127));
        let mut back = vec![0f32; 64];
        dequantize_int8(&e, s, &mut back);
        for (a, b) in x.iter().zip(&back) {
            assert!((a - b).abs() <= s / 2.0 + 1e-7, "{a} vs {b}");
        }
    }

    #[test]
    fn int8_of_zero_and_non_finite_values() {
        let mut e = vec![1i8; 3];
        assert_eq!(quantize_int8(&[0.0; 3], &mut e), 0.0);
        assert_eq!(e, [0, 0, 0]);
        let s = quantize_int8(&[f32::NAN, 0.5, f32::INFINITY], &mut e);
        assert_eq!(e, [0, 127, 0]);
        assert!((s - 0.5 / 127.0).abs() < 1e-9);
    }

    #[test]
    fn flag_values_parse_and_print() {
        for t in EmbeddingType::ALL {
            assert_eq!(t.as_str().parse::<EmbeddingType>().unwrap(), t);
            assert_eq!(serde_json::to_value(t).unwrap(), t.as_str());
        }
        assert!("f64".parse::<EmbeddingType>().is_err());
        assert!(EmbeddingType::F32.quantization().is_none());
        assert_eq!(
            EmbeddingType::Int8
                .quantization()
                .unwrap()
                .scale_column
                .as_deref(),
            Some(SCALE_COLUMN)
        );
    }
}
