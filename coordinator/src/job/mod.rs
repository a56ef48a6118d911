//! The control plane: a job's life from its plan to its manifest.
//!
//! A job is an input, an output, a model and a tiling ([`output`] decides which
//! job an output holds). [`plan`] streams the input's listing into
//! deterministic tasks; [`run`] executes them in one process, or [`submit`]
//! publishes them to the NATS work queue for pull workers, both after the
//! same [`setup`] (flags, model, the job at the output, the first task). [`status`] reads
//! the job's progress from the job state and the stream; `deadletter` turns
//! tasks JetStream gave up on into failures; [`finalize`] checks that every
//! planned task is done or failed and writes `manifest.json`. [`summary`]
//! renders what a command did.

pub(crate) mod convert;
pub(crate) mod deadletter;
pub mod finalize;
pub(crate) mod holders;
pub(crate) mod manifest;
pub mod output;
pub mod plan;
pub(crate) mod progress;
pub(crate) mod resume;
pub mod run;
pub mod setup;
pub mod status;
pub mod submit;
pub mod summary;

use rsembed_worker::queue::redact_urls;

use crate::cli::{RunArgs, StatusArgs, SubmitArgs};

/// Logs a command's effective configuration, once at start-up: the flags as
/// resolved from the command line and the environment, secrets redacted:
/// `NatsArgs`'s own `Debug` hides its passwords, tokens and URL credentials
/// (as `rsembed-worker`'s log relies on too), and the `redacted_*` functions
/// remove credentials from the input and output URLs.
pub(crate) fn log_config(command: &'static str, config: &impl std::fmt::Debug) {
    tracing::info!(command, config = ?config, "effective configuration");
}

/// `run`'s flags for the log: URLs without credentials (store credentials
/// come from the environment and are not flags).
pub(crate) fn redacted_run(a: &RunArgs) -> RunArgs {
    let mut a = a.clone();
    a.input = redact_urls(&a.input);
    a.output = redact_urls(&a.output);
    a
}

/// `submit`'s flags for the log.
pub(crate) fn redacted_submit(a: &SubmitArgs) -> SubmitArgs {
    let mut a = a.clone();
    a.input = redact_urls(&a.input);
    a.output = redact_urls(&a.output);
    a
}

/// `status`'s flags for the log.
pub(crate) fn redacted_status(a: &StatusArgs) -> StatusArgs {
    let mut a = a.clone();
    a.output = redact_urls(&a.output);
    a
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    /// Everything a subscriber writes, for a test to read back.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn logged(f: impl FnOnce()) -> String {
        let out = Captured::default();
        let w = out.clone();
        let sub = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_writer(move || w.clone())
            .finish();
        tracing::subscriber::with_default(sub, f);
        let bytes = out.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn submit_logs_its_configuration_without_passwords_or_tokens() {
        let cli = Cli::try_parse_from([
            "rsembed",
            "submit",
            "--nats",
            "nats://alice:s3cret-pw@nats-a:4222,nats://bob:other-pw@nats-b:4222",
            "--nats-token",
            "tok-123456",
            "--nats-password",
            "pw-flag-789",
            "--input",
            "https://reader:in-pw@example.com/scenes/",
            "--output",
            "s3://bucket/out",
            "--model",
            "/models/m",
        ])
        .unwrap();
        let Command::Submit(args) = cli.command else {
            panic!("parsed as submit")
        };
        let log = logged(|| log_config("submit", &redacted_submit(&args)));
        for secret in [
            "s3cret-pw",
            "other-pw",
            "tok-123456",
            "pw-flag-789",
            "in-pw",
        ] {
            assert!(!log.contains(secret), "{secret} is logged: {log}");
        }
        for shown in [
            "nats-a:4222",
            "nats-b:4222",
            "s3://bucket/out",
            "/models/m",
            "stream_replicas",
        ] {
            assert!(log.contains(shown), "{shown} is not logged: {log}");
        }
        assert!(log.contains("effective configuration"), "{log}");
    }

    #[test]
    fn status_and_run_log_urls_without_credentials() {
        let cli = Cli::try_parse_from([
            "rsembed",
            "status",
            "--nats",
            "tls://u:hunter2@nats:4222",
            "--output",
            "file:///out",
            "--watch",
        ])
        .unwrap();
        let Command::Status(args) = cli.command else {
            panic!("parsed as status")
        };
        let log = logged(|| log_config("status", &redacted_status(&args)));
        assert!(
            !log.contains("hunter2") && log.contains("nats:4222"),
            "{log}"
        );

        let cli = Cli::try_parse_from([
            "rsembed",
            "run",
            "--input",
            "https://u:hunter3@example.com/a/",
            "--output",
            "/tmp/out",
            "--model",
            "/models/m",
        ])
        .unwrap();
        let Command::Run(args) = cli.command else {
            panic!("parsed as run")
        };
        let log = logged(|| log_config("run", &redacted_run(&args)));
        assert!(
            !log.contains("hunter3") && log.contains("example.com/a/"),
            "{log}"
        );
    }
}
