//! The chip files as the query side reads them: their footers and the
//! statistics kept of them, the `embedding` column as stored, its pages read
//! in place, and the answer's columns decoded from their chunks.

pub mod answer;
mod embeddings;
pub mod footer;
pub mod index;
pub mod manifest;
pub mod pages;
#[cfg(test)]
mod pages_tests;
pub mod wkb;

pub use embeddings::{embeddings, Embeddings};

/// The column of a row's IVF list, appended after the chip columns.
pub const LIST: &str = "list";

/// A row group of an index: which part (file) and which group in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupRef {
    /// The part's place among the index's parts.
    pub part: usize,
    /// Row group within the part.
    pub row_group: usize,
}
