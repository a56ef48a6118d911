//! What `rsembed run` and `rsembed finalize` end with: the one-screen summary
//! of a run and the report of a finalize (which `finalize` without `--nats`
//! gives too, when it converts an older manifest).

use rsembed_schemas::units::human_bytes;
use std::path::PathBuf;

use serde::Serialize;

/// What a run did.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// The job.
    pub(crate) job_id: String,
    /// Output URL.
    pub(crate) output: String,
    /// Output folder, when local.
    pub(crate) local_output: Option<PathBuf>,
    /// Tasks in the plan.
    pub(crate) tasks: u64,
    /// Tasks found finished and not run again.
    pub(crate) tasks_resumed: u64,
    /// Tasks with failed inputs run again (`--retry-failed`).
    pub(crate) tasks_retried: u64,
    /// Inputs planned.
    pub(crate) inputs: u64,
    /// Objects left out as not images (by extension).
    pub(crate) skipped: u64,
    /// Chip rows in the dataset.
    pub(crate) chips: u64,
    /// Chips embedded by this run (less than `chips` on resume).
    pub(crate) chips_embedded: u64,
    /// Chips this run left out because their cloud fraction exceeds
    /// `--max-cloud` (tasks found finished count none).
    pub(crate) cloudy_chips_dropped: u64,
    /// Cells of a window whose every acquisition was all cloud: no row.
    pub(crate) unclear_cells: u64,
    /// A windowed job's items that no window holds.
    pub(crate) outside_windows: u64,
    /// A windowed job's acquisitions past `--max-scenes`, dropped.
    pub(crate) dropped_past_max_scenes: u64,
    /// Inputs recorded in errors/.
    pub failed_inputs: u64,
    /// Inputs that produced no chip and no error (every chip empty or below
    /// `--min-valid`); blocks of split scenes aside.
    pub(crate) inputs_without_chips: u64,
    /// Those inputs, the first thousand (as the manifest lists them).
    pub(crate) empty_inputs: Vec<String>,
    /// Chip files of an earlier plan of the input removed (see `docs/decisions.md`).
    pub(crate) superseded_files: u64,
    /// The job `--overwrite` replaced, if any.
    pub(crate) replaced_job: Option<String>,
    /// Bytes read from the input store.
    pub(crate) bytes_read: u64,
    /// Wall time.
    pub(crate) seconds: f64,
    /// Time the engine spent running batches: the model, the host↔device
    /// copies and any padding (the warm-up probe is not counted).
    pub(crate) engine_seconds: f64,
    /// `engine_seconds` over the time from the model being ready to the last
    /// batch: below 1, the device waited for the readers or the writers.
    pub(crate) engine_busy: f64,
    /// Embedding dimension.
    pub(crate) embed_dim: usize,
}

impl Summary {
    /// Chips embedded per second of wall time.
    pub(crate) fn chips_per_second(&self) -> f64 {
        if self.seconds > 0.0 {
            self.chips_embedded as f64 / self.seconds
        } else {
            0.0
        }
    }

    /// The glob a query engine reads the chips with.
    pub(crate) fn chips_glob(&self) -> String {
        match &self.local_output {
            Some(p) => format!("{}/chips/*.parquet", p.display()),
            None => format!("{}/chips/*.parquet", self.output.trim_end_matches('/')),
        }
    }

    /// The text summary.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let status = if self.failed_inputs == 0 {
            "done".to_owned()
        } else {
            format!("done, {} inputs failed", self.failed_inputs)
        };
        s += &format!("rsembed run: {status} in {:.1} s\n", self.seconds);
        s += &format!("  job             {}\n", self.job_id);
        s += &format!(
            "  tasks           {} ({} already done",
            self.tasks, self.tasks_resumed
        );
        if self.tasks_retried > 0 {
            s += &format!(", {} with failed inputs run again", self.tasks_retried);
        }
        s += ")\n";
        s += &format!("  inputs          {}", self.inputs);
        if self.skipped > 0 {
            s += &format!(
                " ({} other files skipped: not an image by extension)",
                self.skipped
            );
        }
        s += "\n";
        s += &format!(
            "  chips           {} (embedding dim {})\n",
            self.chips, self.embed_dim
        );
        s += &format!("  failed inputs   {}", self.failed_inputs);
        if self.failed_inputs > 0 {
            s += &format!(
                " (reasons in {}/errors/)",
                self.output.trim_end_matches('/')
            );
        }
        s += "\n";
        if let Some(hint) = how_to_retry("run", self.failed_inputs, 0) {
            s += &format!("  retry           {hint}\n");
        }
        if self.cloudy_chips_dropped > 0 {
            s += &format!(
                "  cloudy chips    {} dropped (cloud_fraction over --max-cloud)\n",
                self.cloudy_chips_dropped
            );
        }
        if self.unclear_cells > 0 {
            s += &format!(
                "  unclear cells   {} (no clear pixel in their window: no row)\n",
                self.unclear_cells
            );
        }
        if self.outside_windows > 0 || self.dropped_past_max_scenes > 0 {
            s += &format!(
                "  windows         {} items outside every window, {} acquisitions past --max-scenes dropped\n",
                self.outside_windows, self.dropped_past_max_scenes
            );
        }
        if self.inputs_without_chips > 0 {
            s += &format!(
                "  without chips   {} (no valid pixel, below --min-valid, or over --max-cloud): {}\n",
                self.inputs_without_chips,
                listed(&self.empty_inputs)
            );
        }
        if self.superseded_files > 0 {
            s += &format!(
                "  superseded      {} chip files of an earlier plan of the input removed\n",
                self.superseded_files
            );
        }
        if let Some(old) = &self.replaced_job {
            s += &format!("  replaced        job {old} (--overwrite)\n");
        }
        s += &format!("  chips/s         {:.1}\n", self.chips_per_second());
        if self.chips_embedded > 0 {
            s += &format!(
                "  engine          busy {:.0} % ({:.1} s running batches)\n",
                self.engine_busy * 100.0,
                self.engine_seconds
            );
        }
        s += &format!("  read            {}\n", human_bytes(self.bytes_read));
        s += &format!("  output          {}\n", self.output);
        if self.chips == 0 {
            // A glob over files without rows is no dataset to query.
            s += "  GeoParquet      no chips: nothing to query\n";
            return s;
        }
        s += &format!("  GeoParquet      {}\n", self.chips_glob());
        s += &format!(
            "  query           duckdb -c \"SELECT source_uri, len(embedding) FROM '{}' LIMIT 5\"\n",
            self.chips_glob()
        );
        s
    }
}

/// How to retry what failed, for the summaries of `run`, `submit` and
/// `finalize`; `None` when nothing failed. The same flag of `command` (`run`
/// or `submit`) covers both kinds: inputs recorded in `errors/` (their tasks
/// run again) and tasks recorded as failed in distributed mode (requeued).
pub fn how_to_retry(command: &str, failed_inputs: u64, failed_tasks: u64) -> Option<String> {
    let n = |n: u64, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
    let what = match (failed_inputs, failed_tasks) {
        (0, 0) => return None,
        (i, 0) => format!("{} failed (listed in errors/)", n(i, "input")),
        (0, t) => format!("{} failed", n(t, "task")),
        (i, t) => format!(
            "{} (listed in errors/) and {} failed",
            n(i, "input"),
            n(t, "task")
        ),
    };
    Some(format!(
        "{what}; rerun `rsembed {command}` with the same flags and --retry-failed to retry them"
    ))
}

/// The first few of `v`, and how many more.
fn listed(v: &[String]) -> String {
    const SHOWN: usize = 5;
    let mut s = v.iter().take(SHOWN).cloned().collect::<Vec<_>>().join(", ");
    if v.len() > SHOWN {
        s += &format!(", and {} more", v.len() - SHOWN);
    }
    s
}

/// What a windowed job left out, counted where it was decided: cells by the
/// workers (in their done records), items and acquisitions by `submit`'s plan.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub(crate) struct WindowCounts {
    /// Cells with no clear pixel in their window: no row.
    #[serde(skip_serializing_if = "is_zero")]
    pub(crate) unclear_cells: u64,
    /// Items that no window holds.
    #[serde(skip_serializing_if = "is_zero")]
    pub(crate) outside_windows: u64,
    /// Acquisitions left out of a task by `--max-scenes`.
    #[serde(skip_serializing_if = "is_zero")]
    pub(crate) dropped_past_max_scenes: u64,
}

impl WindowCounts {
    /// A job's counts from its totals and what `submit` recorded.
    pub(crate) fn of(
        totals: &rsembed_schemas::queue::JobTotals,
        record: Option<&rsembed_schemas::queue::JobRecord>,
    ) -> WindowCounts {
        WindowCounts {
            unclear_cells: totals.unclear_cells,
            outside_windows: record.map_or(0, |r| r.outside_windows),
            dropped_past_max_scenes: record.map_or(0, |r| r.dropped_past_max_scenes),
        }
    }

    /// The `windows` line, when there is anything to say.
    pub(crate) fn line(&self) -> String {
        if *self == WindowCounts::default() {
            return String::new();
        }
        format!(
            "  windows    {} unclear cells (no row), {} items outside every window, {} \
             acquisitions past --max-scenes dropped\n",
            self.unclear_cells, self.outside_windows, self.dropped_past_max_scenes
        )
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// What `finalize` found.
#[derive(Debug, Clone, Serialize)]
pub struct FinalizeReport {
    /// The job.
    pub(crate) job_id: String,
    /// Why the job is not complete; empty when the manifest was written.
    pub(crate) gaps: Vec<String>,
    /// Tasks in the plan.
    pub(crate) tasks: u64,
    /// Tasks done.
    pub(crate) done: u64,
    /// Tasks failed (listed in the manifest).
    pub failed: u64,
    /// Chip rows.
    pub(crate) rows: u64,
    /// Failed inputs.
    pub(crate) failed_inputs: u64,
    /// Inputs that gave neither a chip nor an error row.
    pub(crate) inputs_without_chips: u64,
    /// Chip files of no task of the plan, removed (an earlier plan's).
    pub(crate) superseded: u64,
    /// What a windowed job left out.
    #[serde(flatten)]
    pub(crate) windows: WindowCounts,
    /// Where the manifest went, when it was written.
    pub manifest: Option<String>,
    /// Where the STAC collection of the job went, when it was written.
    pub(crate) stac: Option<String>,
    /// What `finalize` without `--nats` did to an older manifest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) converted: Option<String>,
}

impl FinalizeReport {
    /// Text for a terminal.
    pub fn render(&self) -> String {
        let mut s = format!(
            "rsembed finalize: job {}\n  tasks      {}\n  done       {}\n  failed     {}\n  rows       {}\n  failed inputs {}\n",
            self.job_id, self.tasks, self.done, self.failed, self.rows, self.failed_inputs
        );
        if self.inputs_without_chips > 0 {
            s.push_str(&format!(
                "  without chips {} inputs (no valid pixel, below --min-valid, or over --max-cloud; listed in the manifest)\n",
                self.inputs_without_chips
            ));
        }
        if self.superseded > 0 {
            s.push_str(&format!(
                "  superseded {} chip files of an earlier plan removed\n",
                self.superseded
            ));
        }
        s.push_str(&self.windows.line());
        if let Some(hint) = how_to_retry("submit", self.failed_inputs, self.failed) {
            s.push_str(&format!("  retry      {hint}\n"));
        }
        match &self.manifest {
            Some(m) => {
                s.push_str(&format!("  manifest   {m}\n"));
                if let Some(c) = &self.converted {
                    s.push_str(&format!("  converted  {c}\n"));
                }
                if let Some(c) = &self.stac {
                    s.push_str(&format!("  stac       {c}\n"));
                }
            }
            None => {
                s.push_str("  INCOMPLETE: no manifest written\n");
                for g in &self.gaps {
                    s.push_str(&format!("  - {g}\n"));
                }
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn how_to_retry_names_the_flag_only_when_something_failed() {
        assert_eq!(how_to_retry("run", 0, 0), None);
        let h = how_to_retry("run", 2, 0).unwrap();
        assert!(h.starts_with("2 inputs failed (listed in errors/)"), "{h}");
        assert!(
            h.contains("`rsembed run` with the same flags and --retry-failed"),
            "{h}"
        );
        assert!(how_to_retry("submit", 0, 1)
            .unwrap()
            .starts_with("1 task failed;"));
    }
}
