//! The rsembed control plane and CLI: planning, the embedded `run`, `text`.
#![warn(missing_docs)]

pub mod cli;
pub mod error;
pub mod plan;
pub mod queue;
pub mod run;
pub mod summary;
pub mod text;

pub use error::{Error, Result};
