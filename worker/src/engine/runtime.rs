//! Finding and loading the ONNX Runtime shared library.
//!
//! `ort` is built with `load-dynamic`: nothing is downloaded at build time, and
//! the library comes from the PyPI wheel (`onnxruntime` for CPU, `onnxruntime-gpu`
//! for CUDA). The search order is `--ort-lib`, `ORT_DYLIB_PATH`, next to the
//! executable, then the system's library path.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::error::{Error, Result};

/// The ONNX Runtime release the build is made for.
pub(crate) const ORT_VERSION: &str = "1.31.1";

/// File names tried next to the executable, most specific first.
const LIB_NAMES: [&str; 3] = [
    "libonnxruntime.so.1.31.1",
    "libonnxruntime.so.1",
    "libonnxruntime.so",
];

/// Where the library was found, for the start-up log.
#[derive(Debug, Clone)]
pub struct OrtLibrary {
    /// Path handed to the loader (a bare name means the system search path).
    pub path: PathBuf,
    /// Which rule found it.
    pub found_by: &'static str,
}

fn how_to_get() -> String {
    format!(
        "get it with `scripts/setup-ort.sh` (CPU) or `scripts/setup-ort.sh --gpu` (CUDA 13): \
         it runs `pip download onnxruntime=={ORT_VERSION} --no-deps` (or onnxruntime-gpu) and \
         extracts onnxruntime/capi/libonnxruntime.so.{ORT_VERSION} into .cache/ort/; then pass \
         --ort-lib .cache/ort/libonnxruntime.so.{ORT_VERSION} or set \
         ORT_DYLIB_PATH=$PWD/.cache/ort/libonnxruntime.so.{ORT_VERSION}"
    )
}

/// Finds the library without loading it. `explicit` is `--ort-lib`.
pub(crate) fn find_library(explicit: Option<&Path>) -> Result<OrtLibrary> {
    if let Some(p) = explicit {
        if p.is_file() {
            return Ok(OrtLibrary {
                path: p.to_owned(),
                found_by: "--ort-lib",
            });
        }
        return Err(Error::OrtLibrary(format!(
            "ONNX Runtime library given by --ort-lib does not exist: {}; {}",
            p.display(),
            how_to_get()
        )));
    }
    if let Some(p) = std::env::var_os("ORT_DYLIB_PATH").filter(|v| !v.is_empty()) {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(OrtLibrary {
                path: p,
                found_by: "ORT_DYLIB_PATH",
            });
        }
        return Err(Error::OrtLibrary(format!(
            "ORT_DYLIB_PATH names a file that does not exist: {}; {}",
            p.display(),
            how_to_get()
        )));
    }
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_owned))
    {
        for name in LIB_NAMES {
            let p = dir.join(name);
            if p.is_file() {
                return Ok(OrtLibrary {
                    path: p,
                    found_by: "next to the executable",
                });
            }
        }
    }
    Ok(OrtLibrary {
        path: PathBuf::from("libonnxruntime.so"),
        found_by: "system library path",
    })
}

static ENV: OnceLock<std::result::Result<(ort::environment::Environment, OrtLibrary), String>> =
    OnceLock::new();

/// Loads ONNX Runtime once per process and returns its environment.
///
/// The first call decides the library; later calls get the same one whatever
/// they pass, because a process can hold only one ONNX Runtime.
pub fn environment(explicit: Option<&Path>) -> Result<(ort::environment::Environment, OrtLibrary)> {
    ENV.get_or_init(|| {
        let lib = find_library(explicit).map_err(|e| e.to_string())?;
        let builder = ort::init_from(&lib.path).map_err(|e| {
            format!(
                "ONNX Runtime library not loaded ({}: {}): {e}; {}",
                lib.found_by,
                lib.path.display(),
                how_to_get()
            )
        })?;
        let env = builder
            .with_name("rsembed")
            .build()
            .map_err(|e| format!("ONNX Runtime environment: {e}"))?;
        tracing::info!(path = %lib.path.display(), found_by = lib.found_by, "loaded ONNX Runtime");
        Ok((env, lib))
    })
    .clone()
    .map_err(Error::OrtLibrary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_missing_library_says_how_to_get_it() {
        let err = find_library(Some(Path::new("/nonexistent/libonnxruntime.so"))).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("--ort-lib"), "{msg}");
        assert!(msg.contains("pip download onnxruntime==1.31.1"), "{msg}");
    }
}
