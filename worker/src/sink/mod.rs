//! Writing results: Arrow rows, GeoParquet files, commit to object storage.

pub mod parquet;
pub mod rows;
