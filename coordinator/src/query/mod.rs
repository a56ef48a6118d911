//! The query commands, over the `rsembed-query` crate (`coordinator/query/`),
//! which opens an index, prunes and scans its row groups, and probes an IVF
//! layout: [`search`] and [`classify`] score chips against a query;
//! [`compact`] rewrites a job's per-task files into large Hilbert-sorted
//! parts, and with `--lists` into an IVF layout whose nearest lists a search
//! reads alone; `html` and `thumbs` make the `--html` page.

pub mod classify;
pub mod compact;
pub(crate) mod html;
pub(crate) mod result;

pub mod search;
pub(crate) mod thumbs;

pub(crate) use rsembed_query::Error;

#[cfg(test)]
mod pages_tests;
