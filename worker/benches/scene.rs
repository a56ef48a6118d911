//! Placeholder replaced by the scene benchmark.
fn main() {}
