//! The rsembed worker: reads inputs, decodes and preprocesses them, runs the
//! SigLIP vision graph in ONNX Runtime and writes GeoParquet.
//!
//! The same code runs inside `rsembed run` (embedded mode) and inside the
//! `rsembed-worker` pull worker.
#![warn(missing_docs)]

// Public is what the `rsembed-worker` binary, the coordinator, `bench/` and
// the tests use of the worker; everything else is `pub(crate)` (docs/decisions.md,
// "Query crate"). `input` and `sink` show only what their own files make public.
pub mod batch;
pub mod check;
pub(crate) mod composite;
pub(crate) mod context;
pub mod engine;
pub mod error;
pub mod exit;
pub mod http;
pub mod input;
pub mod metrics;
pub mod model;
pub mod preprocess;
pub mod pull;
pub mod queue;
pub mod retry;
pub mod sink;
pub mod store;
pub mod task;

pub use error::Error;

pub use rsembed_schemas::datetime::now_rfc3339;
