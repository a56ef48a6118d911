//! `rsembed run`'s progress: a bar on a terminal, a line every
//! `--progress-interval` otherwise.
//!
//! It counts tasks, the unit the run works in: a scene split into chip blocks
//! is one input but many tasks, so a count of inputs done against inputs
//! planned ran past its total (issue 28.9). The ETA comes from the rate of
//! tasks this process ran (tasks found finished take no time and would make
//! it far too short), once the listing has ended and the total is known.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rsembed_worker::task::Counters;

use crate::job::plan::ListStats;
use crate::job::status::fmt_secs;

/// Tasks finished so far, counted by the run as their results come back.
#[derive(Debug, Default)]
pub(crate) struct TaskCounts {
    /// Tasks finished: run by this process or found finished.
    pub(crate) done: AtomicU64,
    /// Of those, tasks found finished and not run again.
    pub(crate) resumed: AtomicU64,
}

/// Where a run stands, read once for one line.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct View {
    /// Since the first task was planned.
    pub(crate) elapsed: Duration,
    /// Tasks finished (run or found finished).
    pub(crate) done: u64,
    /// Tasks found finished.
    pub(crate) resumed: u64,
    /// Tasks planned so far (the total once `listed`).
    pub(crate) planned: u64,
    /// Inputs planned so far.
    pub(crate) inputs: u64,
    /// The listing has ended.
    pub(crate) listed: bool,
    /// Chips embedded by this process.
    pub(crate) chips: u64,
    /// Inputs recorded as failed by this process.
    pub(crate) failed: u64,
}

impl View {
    fn read(elapsed: Duration, tasks: &TaskCounts, c: &Counters, s: &ListStats) -> View {
        View {
            elapsed,
            done: tasks.done.load(Ordering::Relaxed),
            resumed: tasks.resumed.load(Ordering::Relaxed),
            planned: s.tasks.load(Ordering::Relaxed),
            inputs: s.inputs.load(Ordering::Relaxed),
            listed: s.listed.load(Ordering::Relaxed),
            chips: c.chips.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
        }
    }

    /// Time left at the rate of the tasks this process ran; `None` while
    /// the listing goes on (the total is not known) or before a task ran.
    pub(crate) fn eta(&self) -> Option<Duration> {
        let ran = self.done.saturating_sub(self.resumed);
        if !self.listed || ran == 0 {
            return None;
        }
        let left = self.planned.saturating_sub(self.done) as f64;
        Some(Duration::from_secs_f64(
            left * self.elapsed.as_secs_f64() / ran as f64,
        ))
    }

    fn chips_per_s(&self) -> f64 {
        self.chips as f64 / self.elapsed.as_secs_f64().max(1e-3)
    }

    fn eta_text(&self) -> String {
        match self.eta() {
            Some(d) => fmt_secs(d.as_secs_f64()),
            None if !self.listed => "- (listing)".into(),
            None => "-".into(),
        }
    }

    /// What follows the task count: inputs, chips, rate, failures, ETA.
    fn details(&self) -> String {
        let resumed = if self.resumed > 0 {
            format!(" ({} already done)", self.resumed)
        } else {
            String::new()
        };
        format!(
            "{resumed}, {} input{}, {} chips, {:.1} chips/s, {} failed inputs, ETA {}",
            self.inputs,
            if self.inputs == 1 { "" } else { "s" },
            self.chips,
            self.chips_per_s(),
            self.failed,
            self.eta_text()
        )
    }

    /// One progress line for logs.
    pub(crate) fn line(&self) -> String {
        format!(
            "rsembed run: [{}] tasks {}/{}{}{}",
            fmt_secs(self.elapsed.as_secs_f64()),
            self.done,
            self.planned,
            if self.listed { "" } else { "+" },
            self.details()
        )
    }
}

/// A progress bar on a terminal; a line every `every` otherwise.
pub(crate) struct Progress {
    bar: Option<indicatif::ProgressBar>,
    ticker: tokio::task::JoinHandle<()>,
    last_line: Option<Box<dyn Fn() -> String + Send + Sync>>,
}

impl Progress {
    /// Starts showing progress of `tasks`, `counters` and the plan's `stats`.
    pub(crate) fn start(
        tasks: Arc<TaskCounts>,
        counters: Arc<Counters>,
        stats: Arc<ListStats>,
        every: Duration,
    ) -> Progress {
        let started = Instant::now();
        let view = move || View::read(started.elapsed(), &tasks, &counters, &stats);
        if !std::io::stderr().is_terminal() {
            // Logs and CI consoles: a line every `every`, so a long run is
            // not silent until its summary.
            let v = view.clone();
            let ticker = tokio::spawn(async move {
                let mut tick = tokio::time::interval(every.max(Duration::from_millis(100)));
                tick.tick().await;
                loop {
                    tick.tick().await;
                    eprintln!("{}", v().line());
                }
            });
            // A last line at the end, so even a short run's log says how
            // far it got.
            return Progress {
                bar: None,
                ticker,
                last_line: Some(Box::new(move || view().line())),
            };
        }
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} tasks{msg}",
            )
            .expect("progress template is valid"),
        );
        let b = bar.clone();
        let ticker = tokio::spawn(async move {
            loop {
                let v = view();
                b.set_length(v.planned);
                b.set_position(v.done);
                b.set_message(v.details());
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        Progress {
            bar: Some(bar),
            ticker,
            last_line: None,
        }
    }

    /// Stops the display, with a last line in logs.
    pub(crate) fn finish(&self) {
        self.ticker.abort();
        if let Some(last) = &self.last_line {
            eprintln!("{}", last());
        }
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view() -> View {
        View {
            elapsed: Duration::from_secs(10),
            done: 0,
            resumed: 0,
            planned: 25,
            inputs: 1,
            listed: true,
            chips: 0,
            failed: 0,
        }
    }

    #[test]
    fn a_split_scene_counts_its_tasks_not_its_one_input() {
        // One scene cut into 25 chip-block tasks, 5 of them done.
        let v = View {
            done: 5,
            chips: 500,
            ..view()
        };
        assert_eq!(
            v.line(),
            "rsembed run: [0:00:10] tasks 5/25, 1 input, 500 chips, 50.0 chips/s, \
             0 failed inputs, ETA 0:00:40"
        );
    }

    #[test]
    fn while_listing_the_total_is_open_and_there_is_no_eta() {
        let v = View {
            done: 5,
            planned: 7,
            listed: false,
            chips: 500,
            ..view()
        };
        assert_eq!(v.eta(), None);
        let line = v.line();
        assert!(line.contains("tasks 5/7+,"), "{line}");
        assert!(line.ends_with("ETA - (listing)"), "{line}");
    }

    #[test]
    fn a_first_run_gets_an_eta_once_a_task_has_finished_and_listing_ended() {
        assert_eq!(view().eta(), None, "no rate yet");
        let v = View { done: 1, ..view() };
        // 1 task in 10 s, 24 left.
        assert_eq!(v.eta(), Some(Duration::from_secs(240)));
    }

    #[test]
    fn tasks_found_finished_do_not_shorten_the_eta() {
        // 20 found finished at once, 2 run in 10 s: 3 left take 15 s.
        let v = View {
            done: 22,
            resumed: 20,
            ..view()
        };
        assert_eq!(v.eta(), Some(Duration::from_secs(15)));
        assert!(
            v.line().contains("tasks 22/25 (20 already done), 1 input,"),
            "{}",
            v.line()
        );
        // Only tasks found finished: no rate yet.
        let v = View {
            done: 20,
            resumed: 20,
            ..view()
        };
        assert_eq!(v.eta(), None);
    }

    #[test]
    fn a_finished_run_has_nothing_left() {
        let v = View {
            done: 25,
            inputs: 3,
            ..view()
        };
        assert_eq!(v.eta(), Some(Duration::ZERO));
        assert!(v.line().contains(", 3 inputs,"), "{}", v.line());
    }
}
