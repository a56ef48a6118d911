//! Writing results: Arrow rows ([`rows`]), GeoParquet files ([`parquet`]),
//! and committing them to object storage ([`commit`]).

pub mod commit;
pub mod parquet;
pub mod rows;
