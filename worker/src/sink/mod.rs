//! Writing results: Arrow rows ([`rows`]), GeoParquet files ([`parquet`]),
//! what a chip file covers ([`extent`]), and committing them to object
//! storage ([`commit`]).

pub mod commit;
pub mod extent;
mod hull;
pub mod parquet;
pub mod rows;
mod snap;
