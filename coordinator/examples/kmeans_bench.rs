//! k-means of `compact --lists` on clustered unit vectors at D = 768: time,
//! Lloyd iterations and the mean best dot product of the rows (the objective
//! spherical k-means maximises), for three kinds of clustering.
//!
//!     cargo run --release -p rsembed-coordinator --example kmeans_bench
use rsembed_query::ivf::kmeans;
use std::time::Instant;
fn main() {
    let dim = 768;
    let mut x = 7u64;
    let mut r = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    let unit = |v: &mut [f32]| {
        let n = v.iter().map(|a| a * a).sum::<f32>().sqrt();
        v.iter_mut().for_each(|a| *a /= n);
    };
    for (clusters, rows, lists, spread) in [
        (500usize, 32000usize, 500usize, 0.2f32),
        (500, 32000, 500, 1.0),
        (100, 32000, 500, 0.5),
    ] {
        let mut centres: Vec<f32> = (0..clusters * dim).map(|_| r()).collect();
        centres.chunks_mut(dim).for_each(unit);
        let mut data = Vec::with_capacity(rows * dim);
        for i in 0..rows {
            let c = &centres[(i * 7919 % clusters) * dim..][..dim];
            let mut v: Vec<f32> = c
                .iter()
                .map(|a| a + r() * 3.46 * spread / (dim as f32).sqrt())
                .collect();
            unit(&mut v);
            data.extend(v);
        }
        let t = Instant::now();
        let k = kmeans(&data, dim, lists, 0, 20);
        let secs = t.elapsed().as_secs_f64();
        let mut out = vec![(0u32, 0f32); rows];
        k.centroids.nearest(&data, &mut out);
        let obj = out.iter().map(|o| o.1 as f64).sum::<f64>() / rows as f64;
        println!("clusters {clusters} rows {rows} lists {lists} spread {spread}: {secs:.2} s, {} iterations, mean best dot {obj:.5}", k.iterations);
    }
}
