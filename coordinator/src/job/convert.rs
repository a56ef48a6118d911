//! `rsembed finalize` without `--nats`: an older output's `manifest.json`
//! (format 1, its lists as JSON arrays) rewritten into the lists
//! `manifest/*.parquet` and a small format 2 `manifest.json`, written last.
//! A format 2 manifest is left as it is.
//!
//! The files list comes from the old `files` and `error_files` as they are
//! (no chip file is read); the failed inputs from the error files
//! themselves, so the new list has them all where format 1 kept the first
//! thousand; failed tasks as they were. Format 1 kept only the first
//! thousand inputs without chips, without their tasks: those are listed
//! with a null `task_id`, and the count stays the old exact one. Keys the
//! old manifest held besides the manifest's own (a compaction's `ivf` and
//! `compacted_from`) are kept.

use rsembed_schemas::job::{Manifest, MANIFEST_FILE, MANIFEST_FORMAT};
use rsembed_schemas::manifest::task_id_of;
use rsembed_worker::store::Location;

use crate::error::{Error, Result};
use crate::job::manifest::{self, ManifestBuilder};
use crate::job::output::put_json;
use crate::job::summary::FinalizeReport;

/// The keys of [`Manifest`]: any other key of an old manifest is kept.
const MANIFEST_KEYS: [&str; 18] = [
    "format",
    "job_id",
    "fingerprint",
    "tasks",
    "rows",
    "failed_inputs",
    "chip_file_count",
    "error_file_count",
    "failed_task_count",
    "inputs_without_chips",
    "lists",
    "files",
    "error_files",
    "failures",
    "failed_tasks",
    "without_chips",
    "finalized_at",
    "software_version",
];

/// Rewrites the format 1 manifest at `output` into format 2.
pub(crate) async fn convert(output: &Location) -> Result<FinalizeReport> {
    let url = format!(
        "{}/{MANIFEST_FILE}",
        output.url.as_str().trim_end_matches('/')
    );
    let Some((old, bytes)) = manifest::read(output).await? else {
        return Err(Error::Output(format!(
            "{url} does not exist: `rsembed finalize` without --nats rewrites a finished \
             job's manifest into the current format; give --nats to finalize a distributed job"
        )));
    };
    let report = |m: &Manifest, converted: String| FinalizeReport {
        job_id: m.job_id.clone(),
        gaps: Vec::new(),
        tasks: m.tasks,
        done: m.chip_file_count,
        failed: m.failed_task_count,
        rows: m.rows,
        failed_inputs: m.failed_inputs,
        inputs_without_chips: m.inputs_without_chips,
        superseded: 0,
        windows: Default::default(),
        manifest: Some(url.clone()),
        stac: None,
        converted: Some(converted),
    };
    if old.format >= MANIFEST_FORMAT {
        return Ok(report(
            &old,
            format!("no: it is already format {}, left as it is", old.format),
        ));
    }
    let mut b = ManifestBuilder::for_job(output, &old.job_id, &old.fingerprint)?;
    for f in &old.files {
        b.chips_file(task_id_of(&f.path), f).await?;
    }
    for e in &old.error_files {
        b.errors_file(task_id_of(&e.path), e).await?;
    }
    b.failures_of_error_files(
        old.error_files
            .iter()
            .map(|e| (task_id_of(&e.path).to_owned(), e.path.clone())),
    )
    .await?;
    for t in &old.failed_tasks {
        b.failed_task(t).await?;
    }
    b.without_chips(None, &old.without_chips).await?;
    let built = b.finish_lists(old.tasks).await?;
    let new = Manifest {
        inputs_without_chips: old.inputs_without_chips,
        ..built.manifest
    };
    let mut doc = serde_json::to_value(&new)?;
    let raw: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&bytes)?;
    for (k, v) in raw {
        if !MANIFEST_KEYS.contains(&k.as_str()) {
            doc[k] = v;
        }
    }
    put_json(output, MANIFEST_FILE, &doc).await?;
    let lists = new.lists.as_ref().expect("a built manifest has lists");
    Ok(report(
        &new,
        format!(
            "from format 1: {} and {} written ({} and {} rows)",
            lists.files.path, lists.failures.path, lists.files.rows, lists.failures.rows
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rsembed_schemas::job::{ManifestFailedTask, ManifestFailure, ManifestFile, ManifestLists};

    #[test]
    fn every_key_of_the_manifest_is_known() {
        let f = ManifestFile {
            path: "p".into(),
            rows: 1,
            sha256: "s".into(),
            bytes: 1,
            extent: None,
        };
        let m = Manifest {
            format: 1,
            job_id: "j".into(),
            fingerprint: "f".into(),
            tasks: 1,
            rows: 1,
            failed_inputs: 1,
            chip_file_count: 1,
            error_file_count: 1,
            failed_task_count: 1,
            inputs_without_chips: 1,
            lists: Some(ManifestLists {
                files: f.clone(),
                failures: f.clone(),
            }),
            files: vec![f.clone()],
            error_files: vec![f],
            failures: vec![ManifestFailure {
                source_uri: "u".into(),
                stage: "s".into(),
                error: "e".into(),
            }],
            failed_tasks: vec![ManifestFailedTask {
                task_id: "t".into(),
                inputs: vec![],
                error: "e".into(),
                deliveries: 1,
            }],
            without_chips: vec!["w".into()],
            finalized_at: "t".into(),
            software_version: "s".into(),
        };
        let v = serde_json::to_value(&m).unwrap();
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(keys.len(), MANIFEST_KEYS.len(), "{keys:?}");
        for k in keys {
            assert!(MANIFEST_KEYS.contains(&k.as_str()), "{k}");
        }
    }
}
