//! The rsembed control plane and CLI: planning, the embedded `run`, the
//! distributed `submit`, `status` and `finalize`, and `text`.
#![warn(missing_docs)]

pub mod cli;
pub mod deadletter;
pub mod error;
pub mod finalize;
pub mod plan;
pub use rsembed_worker::queue;
pub mod run;
pub mod status;
pub mod submit;
pub mod summary;
pub mod text;

pub use error::{Error, Result};
