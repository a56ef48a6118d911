//! The model directory: reading and checking its JSON files, hashing its graphs.
//!
//! Nothing here loads ONNX Runtime, so the coordinator can fingerprint a model
//! on a machine without a GPU or the ORT library.

use std::io::Read;
use std::path::{Path, PathBuf};

use rsembed_schemas::job::{FileDigest, ModelRef};
use rsembed_schemas::model::{
    GraphSpec, ModelManifest, PreprocessorConfig, U8GraphSpec, MODEL_MANIFEST, PREPROCESSOR_CONFIG,
    TOKENIZER,
};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// A model directory whose JSON files parsed.
///
/// Graphs are checked where they are used: an image run needs only the vision
/// graph it runs, a text command only the text graph, so a directory copied
/// without the others still serves them (`ModelDir::graph_path`).
/// [`ModelDir::check_files`] asks for every file the manifest names.
#[derive(Debug, Clone)]
pub struct ModelDir {
    /// The directory.
    pub dir: PathBuf,
    /// `rsembed-model.json`.
    pub manifest: ModelManifest,
    /// `preprocessor_config.json`.
    pub preprocessor: PreprocessorConfig,
}

fn read_file(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| Error::ModelFile {
        path: path.to_owned(),
        source,
    })
}

fn invalid(path: &Path, reason: impl Into<String>) -> Error {
    Error::ModelInvalid {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

/// Hex SHA-256 and size of a file, streamed.
pub fn sha256_file(path: &Path) -> Result<(String, u64)> {
    let mut f = std::fs::File::open(path).map_err(|source| Error::ModelFile {
        path: path.to_owned(),
        source,
    })?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let k = f.read(&mut buf).map_err(|source| Error::ModelFile {
            path: path.to_owned(),
            source,
        })?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        n += k as u64;
    }
    Ok((hex::encode(h.finalize()), n))
}

/// Parses and checks the bytes of `rsembed-model.json`; `path` names it in
/// errors (a local path, or the URL it was read from).
pub fn parse_manifest(path: &Path, bytes: &[u8]) -> Result<ModelManifest> {
    let manifest: ModelManifest =
        serde_json::from_slice(bytes).map_err(|e| invalid(path, format!("does not parse: {e}")))?;
    if manifest.format != 1 {
        return Err(invalid(
            path,
            format!("format {} is not supported (only 1)", manifest.format),
        ));
    }
    if manifest.embed_dim == 0 || manifest.embed_dim > 65_536 {
        return Err(invalid(
            path,
            format!("embed_dim {} is out of range", manifest.embed_dim),
        ));
    }
    match manifest.text.max_length {
        Some(l) if (1..=8192).contains(&l) => {}
        other => {
            return Err(invalid(
                path,
                format!("text.max_length must be 1..=8192, found {other:?}"),
            ))
        }
    }
    for (file, rec) in &manifest.files {
        let plain = !file.is_empty()
            && file.split('/').all(|seg| {
                !seg.is_empty() && seg != "." && seg != ".." && !seg.contains(['\\', '\0'])
            });
        if !plain || file == MODEL_MANIFEST {
            return Err(invalid(
                path,
                format!(
                    "files: {file:?} is not a plain relative path of another file of the directory"
                ),
            ));
        }
        if rec.sha256.len() != 64
            || !rec
                .sha256
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        {
            return Err(invalid(
                path,
                format!(
                    "files.{file:?}.sha256 is not 64 lower-case hex digits: {:?}",
                    rec.sha256
                ),
            ));
        }
    }
    Ok(manifest)
}

impl ModelDir {
    /// Reads and checks a model directory's JSON files. Every failure names
    /// the file at fault.
    pub fn open(dir: impl AsRef<Path>) -> Result<ModelDir> {
        let dir = dir.as_ref().to_path_buf();
        if !dir.is_dir() {
            return Err(Error::ModelFile {
                path: dir.clone(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "not a directory"),
            });
        }
        let mpath = dir.join(MODEL_MANIFEST);
        let manifest = parse_manifest(&mpath, &read_file(&mpath)?)?;
        let ppath = dir.join(PREPROCESSOR_CONFIG);
        let preprocessor: PreprocessorConfig = serde_json::from_slice(&read_file(&ppath)?)
            .map_err(|e| invalid(&ppath, format!("does not parse: {e}")))?;
        check_preprocessor(&ppath, &preprocessor)?;
        Ok(ModelDir {
            dir,
            manifest,
            preprocessor,
        })
    }

    /// Checks that every graph the manifest names is there, for a complete
    /// copy (`fetch-model`, the container self-check).
    pub fn check_files(&self) -> Result<()> {
        for g in self.graphs() {
            self.graph_path(g)?;
        }
        for g in [&self.manifest.vision_u8, &self.manifest.vision_fp16_u8]
            .into_iter()
            .flatten()
        {
            self.file_path(&g.file)?;
        }
        Ok(())
    }

    /// The uint8 entry of the vision graph a run of `fp16` opens, when the
    /// manifest has one.
    pub fn u8_graph(&self, fp16: bool) -> Option<&U8GraphSpec> {
        if fp16 {
            self.manifest.vision_fp16_u8.as_ref()
        } else {
            self.manifest.vision_u8.as_ref()
        }
    }

    /// The path of the uint8 entry of `fp16`'s vision graph, checked to be
    /// usable: its file is there, and the float graph it wraps and the
    /// preprocessor it carries are the ones it was made from (it reads its
    /// weights at offsets into the float graph's file, and its normalisation
    /// is the preprocessor's). `Ok(None)` without an entry; an error, saying
    /// how to fix it, when it is stale.
    pub fn u8_entry(&self, fp16: bool) -> Result<Option<(PathBuf, &U8GraphSpec)>> {
        let Some(u8g) = self.u8_graph(fp16) else {
            return Ok(None);
        };
        let path = self.file_path(&u8g.file)?;
        let float = self.vision_graph(fp16)?;
        let stale = |what: &str| {
            invalid(
                &path,
                format!(
                    "the uint8 entry was made for another {what}; rerun \
                     `python tools/uint8_entry.py {}` (or pass --input-dtype float)",
                    self.dir.display()
                ),
            )
        };
        // The wrapper ends in the float graph's own nodes: a float entry
        // naming another output describes a graph it does not wrap.
        if u8g.output != float.output {
            return Err(stale(&format!(
                "output than the float entry's `{}` (it gives `{}`)",
                float.output, u8g.output
            )));
        }
        let (wrapped, _) = sha256_file(&self.graph_path(float)?)?;
        if wrapped != u8g.wraps_sha256 {
            return Err(stale(&format!("{} than this one", float.file)));
        }
        let (pre, _) = sha256_file(&self.path(PREPROCESSOR_CONFIG))?;
        if pre != u8g.preprocessor_sha256 {
            return Err(stale(&format!("{PREPROCESSOR_CONFIG} than this one")));
        }
        Ok(Some((path, u8g)))
    }

    fn file_path(&self, file: &str) -> Result<PathBuf> {
        let p = self.dir.join(file);
        if p.is_file() {
            return Ok(p);
        }
        Err(Error::ModelFile {
            path: p,
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("named by {MODEL_MANIFEST} but missing"),
            ),
        })
    }

    /// Path of a graph of the manifest, checked to exist.
    pub(crate) fn graph_path(&self, g: &GraphSpec) -> Result<PathBuf> {
        self.file_path(&g.file)
    }

    /// Every graph the manifest names.
    pub fn graphs(&self) -> impl Iterator<Item = &GraphSpec> {
        [&self.manifest.vision, &self.manifest.text]
            .into_iter()
            .chain(self.manifest.vision_fp16.as_ref())
    }

    /// The vision graph to run, fp16 or not.
    pub fn vision_graph(&self, fp16: bool) -> Result<&GraphSpec> {
        if !fp16 {
            return Ok(&self.manifest.vision);
        }
        self.manifest.vision_fp16.as_ref().ok_or_else(|| {
            invalid(
                &self.dir.join(MODEL_MANIFEST),
                "--fp16 was asked for but the manifest has no `vision_fp16` graph; \
                 re-export with `tools/export_onnx.py --fp16`",
            )
        })
    }

    /// Path of a file of the directory.
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// Path of `tokenizer.json`, checked to exist.
    pub fn tokenizer_path(&self) -> Result<PathBuf> {
        let p = self.dir.join(TOKENIZER);
        if p.is_file() {
            Ok(p)
        } else {
            Err(Error::ModelFile {
                path: p,
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "missing"),
            })
        }
    }

    /// Model identity for job specs: the digests of the vision graph the job
    /// runs and of the preprocessor, the only files that shape its embeddings.
    /// The other graphs are neither read nor required, so the identity does
    /// not depend on whether a copy of the directory carries them. A uint8
    /// entry is the float graph's (same weights, the preprocessor's own
    /// normalisation): adding one, or feeding it, leaves the identity as it was.
    pub fn model_ref(&self, fp16: bool) -> Result<ModelRef> {
        let vision = self.vision_graph(fp16)?;
        let (sha256, bytes) = sha256_file(&self.graph_path(vision)?)?;
        let (preprocessor_sha256, _) = sha256_file(&self.path(PREPROCESSOR_CONFIG))?;
        Ok(ModelRef {
            name: self.manifest.name.clone(),
            embed_dim: self.manifest.embed_dim,
            sha256: sha256.clone(),
            files: vec![FileDigest {
                path: vision.file.clone(),
                sha256,
                bytes,
            }],
            preprocessor_sha256,
            fp16,
        })
    }
}

fn check_preprocessor(path: &Path, p: &PreprocessorConfig) -> Result<()> {
    let s = p.size;
    if s.height == 0 || s.width == 0 || s.height > 8192 || s.width > 8192 {
        return Err(invalid(
            path,
            format!("size {}x{} is out of range", s.width, s.height),
        ));
    }
    if crate::preprocess::resize::Filter::from_pil_code(p.resample).is_none() {
        return Err(invalid(
            path,
            format!("resample {} is not a PIL filter code (0-5)", p.resample),
        ));
    }
    if p.do_normalize {
        if p.image_mean.len() != 3 || p.image_std.len() != 3 {
            return Err(invalid(path, "image_mean and image_std need 3 values"));
        }
        if p.image_std.iter().any(|s| *s == 0.0 || !s.is_finite()) {
            return Err(invalid(path, "image_std must be finite and non-zero"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest_with_files(files: &str) -> Vec<u8> {
        format!(
            r#"{{"format": 1, "name": "x", "embed_dim": 4,
                "vision": {{"file": "v.onnx", "input": "pixel_values", "output": "image_embeds"}},
                "text": {{"file": "t.onnx", "input": "input_ids", "output": "text_embeds", "max_length": 8}},
                "logit_scale": 1.0, "logit_bias": 0.0, "files": {files}}}"#
        )
        .into_bytes()
    }

    #[test]
    fn recorded_digests_are_checked_for_form() {
        let sha = "ab".repeat(32);
        let p = Path::new("m/rsembed-model.json");
        let ok = manifest_with_files(&format!(
            r#"{{"v.onnx": {{"sha256": "{sha}", "bytes": 1}}, "w/d.bin": {{"sha256": "{sha}", "bytes": 2}}}}"#
        ));
        assert_eq!(parse_manifest(p, &ok).unwrap().files.len(), 2);
        for (files, why) in [
            (
                format!(r#"{{"../v.onnx": {{"sha256": "{sha}", "bytes": 1}}}}"#),
                "not a plain relative path",
            ),
            (
                format!(r#"{{"/v.onnx": {{"sha256": "{sha}", "bytes": 1}}}}"#),
                "not a plain relative path",
            ),
            (
                format!(r#"{{"rsembed-model.json": {{"sha256": "{sha}", "bytes": 1}}}}"#),
                "not a plain relative path",
            ),
            (
                r#"{"v.onnx": {"sha256": "abc", "bytes": 1}}"#.to_owned(),
                "64 lower-case hex",
            ),
            (
                format!(
                    r#"{{"v.onnx": {{"sha256": "{}", "bytes": 1}}}}"#,
                    "AB".repeat(32)
                ),
                "64 lower-case hex",
            ),
        ] {
            let err = parse_manifest(p, &manifest_with_files(&files))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(why) && err.contains("rsembed-model.json"),
                "{files}: {err}"
            );
        }
    }
}
