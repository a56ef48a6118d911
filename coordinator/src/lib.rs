//! The rsembed control plane and CLI: planning, the embedded `run`, the
//! distributed `submit`, `status` and `finalize`, `text`, and the query side:
//! `search`, `classify` and `compact`; and `fetch-model` for deployments.
#![warn(missing_docs)]

pub mod classify;
pub mod cli;
pub mod compact;
pub mod deadletter;
pub mod error;
pub mod fetch_model;
pub mod finalize;
pub mod index;
pub mod output;
pub mod plan;
pub use rsembed_worker::queue;
pub mod run;
pub mod scan;
pub mod search;
pub mod status;
pub mod submit;
pub mod summary;
pub mod text;

pub use error::{Error, Result};
