//! The query side: reading a finished dataset back.
//!
//! `index` opens a job's output, a compacted dataset or one Parquet file and
//! prunes row groups by their `bbox` statistics; `scan` reads the selected
//! row groups in parallel and scores them; [`search`] and [`classify`] are the
//! two commands over that scan; [`compact`] rewrites a job's per-task files
//! into large Hilbert-sorted parts, and with `--lists` into an IVF layout
//! ([`ivf`]) whose nearest lists a search reads alone.

pub mod classify;
pub mod compact;
pub(crate) mod html;
pub(crate) mod result;

pub mod search;
pub(crate) mod thumbs;

pub(crate) use rsembed_query::Error;

#[cfg(test)]
mod pages_tests;
