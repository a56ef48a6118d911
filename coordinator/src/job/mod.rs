//! The control plane: a job's life from its plan to its manifest.
//!
//! A job is an input, an output, a model and a tiling ([`output`] decides which
//! job an output holds). [`plan`] streams the input's listing into
//! deterministic tasks; [`run`] executes them in one process, or [`submit`]
//! publishes them to the NATS work queue for pull workers. [`status`] reads
//! the job's progress from the job state and the stream; [`deadletter`] turns
//! tasks JetStream gave up on into failures; [`finalize`] checks that every
//! planned task is done or failed and writes `manifest.json`. [`summary`]
//! renders what a command did.

pub mod deadletter;
pub mod finalize;
pub mod output;
pub mod plan;
pub mod run;
pub mod status;
pub mod submit;
pub mod summary;
