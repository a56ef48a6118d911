//! The rsembed control plane and CLI: a job's life ([`job`]: planning, the
//! embedded `run`, the distributed `submit`, `status` and `finalize`), `text`,
//! the query commands ([`query`]: `search`, `classify` and `compact`, run by
//! the `rsembed-query` crate with the model and chip reader lent here), and
//! `fetch-model` for deployments.
#![warn(missing_docs)]

pub mod cli;
pub mod error;
pub mod fetch_model;
pub mod job;
pub mod query;
pub mod stac;
pub use rsembed_worker::queue;
pub mod text;

pub use error::{Error, Result};

#[cfg(test)]
mod error_tests;
