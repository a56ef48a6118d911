//! The query files of a batch search: `--vectors` (JSON Lines, one vector a
//! line) and `--queries` (one text a line).
//!
//! Each query keeps the line number it has in its file, so that results join
//! back to the file whatever lines were skipped. Blank lines are skipped. The
//! file and the number of queries are bounded: every query holds a top-K for
//! the whole scan.

use std::io::Read;
use std::path::Path;

use crate::kernels::normalize;
use crate::{Error as QueryError, Result};

/// Queries in one batch, at most: each keeps D floats and K hits for the
/// whole scan, and is scored against every row.
pub(crate) const MAX_QUERIES: usize = 10_000;
/// Bytes of a query file, at most (10,000 vectors of D = 1152 as JSON are
/// about 150 MB).
const MAX_FILE_BYTES: u64 = 512 << 20;

fn read(flag: &'static str, path: &Path) -> Result<String> {
    let err = |e: std::io::Error| QueryError::FlagFile {
        flag,
        path: path.to_owned(),
        source: Box::new(e),
    };
    let mut text = String::new();
    std::fs::File::open(path)
        .map_err(err)?
        .take(MAX_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(err)?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(QueryError::flag(
            flag,
            format!(
                "{}: larger than {} MiB; split it into several searches",
                path.display(),
                MAX_FILE_BYTES >> 20
            ),
        ));
    }
    Ok(text)
}

/// The (line number, line) pairs of `text` that are not blank, bounded.
fn lines<'a>(flag: &'static str, path: &Path, text: &'a str) -> Result<Vec<(usize, &'a str)>> {
    let lines: Vec<(usize, &str)> = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty())
        .collect();
    if lines.is_empty() {
        return Err(QueryError::flag(
            flag,
            format!("{}: no queries in it", path.display()),
        ));
    }
    if lines.len() > MAX_QUERIES {
        return Err(QueryError::flag(
            flag,
            format!(
                "{}: {} queries; one search answers at most {MAX_QUERIES}, split the file",
                path.display(),
                lines.len()
            ),
        ));
    }
    Ok(lines)
}

/// `--vectors`: one JSON array of `dim` numbers a line, each normalised.
pub(crate) fn vectors(path: &Path, dim: usize) -> Result<Vec<(Option<usize>, Vec<f32>)>> {
    const FLAG: &str = "--vectors";
    let text = read(FLAG, path)?;
    let mut out = Vec::new();
    for (n, line) in lines(FLAG, path, &text)? {
        let v = vector_line(line, dim)
            .map_err(|why| QueryError::flag(FLAG, format!("{} line {n}: {why}", path.display())))?;
        out.push((Some(n), v));
    }
    Ok(out)
}

/// One line of `--vectors` (a file's or stdin's) as a unit query vector of
/// `dim` numbers, or why not.
pub(crate) fn vector_line(line: &str, dim: usize) -> std::result::Result<Vec<f32>, String> {
    let mut v: Vec<f32> = serde_json::from_str(line.trim())
        .map_err(|e| format!("want one JSON array of numbers: {e}"))?;
    if v.len() != dim {
        return Err(format!(
            "{} numbers, but the index's embeddings have {dim}",
            v.len()
        ));
    }
    normalize(&mut v).map_err(|_| "a zero (or non-finite) vector".to_owned())?;
    Ok(v)
}

/// `--queries`: one text a line, with its line number.
pub(crate) fn texts(path: &Path) -> Result<Vec<(usize, String)>> {
    const FLAG: &str = "--queries";
    let text = read(FLAG, path)?;
    Ok(lines(FLAG, path, &text)?
        .into_iter()
        .map(|(n, l)| (n, l.to_owned()))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_numbers_survive_blank_lines_and_bad_lines_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("v.jsonl");
        std::fs::write(&p, "[1, 0]\n\n  \n[0, 2]\r\n").unwrap();
        let v = vectors(&p, 2).unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!((v[0].0, v[1].0), (Some(1), Some(4)));
        assert_eq!(v[1].1, vec![0.0, 1.0]);

        std::fs::write(&p, "[1, 0]\n[1, 2, 3]\n").unwrap();
        let e = vectors(&p, 2).unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("3 numbers"), "{e}");
        std::fs::write(&p, "[0, 0]\n").unwrap();
        assert!(vectors(&p, 2).unwrap_err().to_string().contains("zero"));
        std::fs::write(&p, "{\"a\": 1}\n").unwrap();
        assert!(vectors(&p, 2).unwrap_err().to_string().contains("line 1"));
        std::fs::write(&p, "\n\n").unwrap();
        assert!(vectors(&p, 2)
            .unwrap_err()
            .to_string()
            .contains("no queries"));
        std::fs::write(&p, "[1, 0]\n".repeat(MAX_QUERIES + 1)).unwrap();
        assert!(vectors(&p, 2).unwrap_err().to_string().contains("at most"));

        let t = dir.path().join("q.txt");
        std::fs::write(&t, "rivers\n\nan airport\n").unwrap();
        assert_eq!(
            texts(&t).unwrap(),
            vec![(1, "rivers".to_owned()), (3, "an airport".to_owned())]
        );
    }
}
