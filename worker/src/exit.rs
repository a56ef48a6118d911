//! How a process that used CUDA ends.
//!
//! On an H200 `rsembed run` ended with SIGSEGV (exit status 139) after it had
//! written its last file and its summary, in four runs of four with two tasks
//! in flight (`bench/gpu`; docs/decisions.md, "Leaving without teardown after
//! CUDA"; the cause is not known). All the work was kept, but
//! a shell, a Kubernetes Job or Argo reads 139 as a failed run and runs it
//! again. What was left to run was teardown only: the async runtime's
//! threads and the C++ destructors of ONNX Runtime and of its CUDA provider,
//! whose environment lives to the end of the process. So a process that
//! loaded CUDA flushes its output and leaves without running them
//! (`_exit`), as it already does on Ctrl-C.

use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set when a session is opened on CUDA.
pub(crate) static CUDA_LOADED: AtomicBool = AtomicBool::new(false);

/// Whether this process opened a CUDA session.
pub(crate) fn cuda_loaded() -> bool {
    CUDA_LOADED.load(Ordering::Relaxed)
}

/// Ends the process with `code` once everything it wrote is flushed: at once,
/// skipping teardown, when it loaded CUDA; otherwise hands `code` back for
/// `main` to return. Call it last, with every file closed.
pub fn finish(code: ExitCode) -> ExitCode {
    if !cuda_loaded() || std::env::var_os("RSEMBED_EXIT_NORMALLY").is_some() {
        return code;
    }
    let status = status_of(code);
    tracing::debug!(status, "leaving without teardown (CUDA was loaded)");
    leave(status)
}

/// Ends an interrupted process (Ctrl-C) with `status` at once, skipping
/// teardown whatever device it used. `exit` would run ONNX Runtime's C++
/// destructors while the inference thread is inside a run, and that run then
/// fails and logs an error ("Non-zero status code ... GetElementType is not
/// implemented") for a batch cancelled on purpose. Finished tasks are already
/// committed; an unfinished one has written nothing under its final name.
pub fn interrupted(status: i32) -> ! {
    leave(status)
}

fn leave(status: i32) -> ! {
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: _exit ends the process at once; nothing after it runs.
    unsafe { libc::_exit(status) }
}

/// The number `code` stands for (`ExitCode` does not say).
fn status_of(code: ExitCode) -> i32 {
    (0..=255u8)
        .find(|n| code == ExitCode::from(*n))
        .map_or(1, i32::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_keep_their_numbers() {
        assert_eq!(status_of(ExitCode::SUCCESS), 0);
        assert_eq!(status_of(ExitCode::FAILURE), 1);
        assert_eq!(status_of(ExitCode::from(3)), 3);
        assert_eq!(status_of(ExitCode::from(130)), 130);
    }

    #[test]
    fn without_cuda_the_code_comes_back() {
        assert!(!cuda_loaded());
        assert_eq!(finish(ExitCode::from(3)), ExitCode::from(3));
    }
}
