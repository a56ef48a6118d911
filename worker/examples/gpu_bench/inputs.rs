//! Synthetic pixel batches, embedding comparisons and the PyTorch parity check.

use super::*;

/// `n` distinct pseudo-random images in [-1, 1], image `first + i` always the
/// same whatever batch it is in.
pub(crate) fn images(first: usize, n: usize, s: ImageShape) -> PixelBatch {
    let len = s.channels * s.height * s.width;
    let mut data = Vec::with_capacity(n * len);
    for k in first..first + n {
        // xorshift64*, seeded by the image index.
        let mut x = (k as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        for _ in 0..len {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            let r = x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40; // 24 bits
            data.push(r as f32 / (1u32 << 23) as f32 - 1.0);
        }
    }
    PixelBatch {
        n,
        channels: s.channels,
        height: s.height,
        width: s.width,
        data: data.into(),
    }
}

pub(crate) fn prefix(b: &PixelBatch, n: usize) -> PixelBatch {
    PixelBatch {
        n,
        channels: b.channels,
        height: b.height,
        width: b.width,
        data: b.data.padded(0..n * b.image_len(), 0),
    }
}

pub(crate) fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (*x as f64, *y as f64);
        ab += x * y;
        aa += x * x;
        bb += y * y;
    }
    ab / (aa.sqrt() * bb.sqrt()).max(1e-30)
}

pub(crate) fn read_f32(path: &Path) -> Res<Vec<f32>> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if bytes.len() % 4 != 0 {
        return Err(format!("{}: not float32 data", path.display()));
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

pub(crate) fn open(c: &Common, cfg: &SessionConfig) -> Res<(ModelDir, OrtVision, f64)> {
    let model = ModelDir::open(&c.model).map_err(|e| engine_err("model directory", &e))?;
    let t = Instant::now();
    let v = OrtVision::open(&model, c.fp16, cfg).map_err(|e| engine_err("opening", &e))?;
    Ok((model, v, t.elapsed().as_secs_f64()))
}

// --------------------------------------------------------------------- parity

/// Embeds `bench_parity.json`'s input with this session and compares with
/// PyTorch's float32 embeddings (both L2-normalized).
pub(crate) fn parity(model: &ModelDir, v: &mut OrtVision) -> Res<Value> {
    let spec_path = model.dir.join("bench_parity.json");
    if !spec_path.is_file() {
        return Ok(Value::Null);
    }
    let spec: Value =
        serde_json::from_str(&std::fs::read_to_string(&spec_path).map_err(err)?).map_err(err)?;
    let n = spec["n"].as_u64().ok_or("bench_parity.json: n")? as usize;
    let dim = spec["dim"].as_u64().ok_or("bench_parity.json: dim")? as usize;
    let input = read_f32(&model.dir.join(spec["input"].as_str().ok_or("input")?))?;
    let reference = read_f32(
        &model
            .dir
            .join(spec["reference"].as_str().ok_or("reference")?),
    )?;
    let s = ImageShape::of_model(model);
    let il = s.channels * s.height * s.width;
    if input.len() != n * il || reference.len() != n * dim {
        return Err(format!(
            "bench_parity.json: {} input / {} reference floats for n={n}, dim={dim}",
            input.len(),
            reference.len()
        ));
    }
    let batch = PixelBatch {
        n,
        channels: s.channels,
        height: s.height,
        width: s.width,
        data: input.into(),
    };
    let got = v.embed(&batch).map_err(|e| engine_err("parity run", &e))?;
    if got.dim != dim {
        return Err(format!(
            "parity: dim {} but the reference has {dim}",
            got.dim
        ));
    }
    let cos: Vec<f64> = (0..n)
        .map(|i| cosine(got.row(i), &reference[i * dim..(i + 1) * dim]))
        .collect();
    let min = cos.iter().copied().fold(1.0, f64::min);
    let max_abs = (0..n * dim)
        .map(|i| (got.data[i] - reference[i]).abs())
        .fold(0f32, f32::max);
    Ok(json!({ "n": n, "min_cosine": min, "max_abs_diff_normalized": max_abs }))
}
