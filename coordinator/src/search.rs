//! `rsembed search`.

use std::io::Write;

use crate::cli::SearchArgs;
use crate::error::{Error, Result};

/// Runs a search and prints its results to `out`.
pub async fn run(_args: SearchArgs, _out: &mut dyn Write) -> Result<()> {
    Err(Error::Usage("rsembed search: not built yet".into()))
}
