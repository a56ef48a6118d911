//! Who holds a job's running tasks, told from their running marks'
//! heartbeats, for `status`.
//!
//! One ack wait `W` decides everything (see `docs/distributed.md`, "A dead
//! worker"): a worker renews its task's running mark with every in-progress
//! ack, every `W/3`; JetStream redelivers a task `W` after its last progress
//! ack. So a mark silent for over two heartbeats (`2W/3`) is held by a worker
//! that is dead or stuck, and the task goes back `W` after that heartbeat:
//! to the next worker that pulls (a redelivery needs a pull), which writes a
//! mark of its own over this one.

use std::time::Duration;

use rsembed_schemas::queue::TaskRunning;
use serde::Serialize;

/// How many silent holders `status` names; the counts are always whole.
pub(crate) const SILENT_LISTED: usize = 10;

/// A task whose holder has stopped sending heartbeats.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SilentHolder {
    /// The task.
    pub(crate) task_id: String,
    /// The worker its running mark names.
    pub(crate) worker: String,
    /// The delivery it holds.
    pub(crate) delivery: u64,
    /// Seconds since its last heartbeat.
    pub(crate) silent_s: f64,
    /// Seconds until JetStream hands the task to the next worker that pulls;
    /// 0 once that is due.
    pub(crate) redelivery_in_s: f64,
}

/// The running marks of a job's unfinished tasks, sorted.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Holders {
    /// Held by a worker that sent a heartbeat lately (or by an older worker
    /// whose marks have none).
    pub(crate) live: u64,
    /// Held by a silent worker, and still held by JetStream: in flight.
    pub(crate) silent: u64,
    /// Silent past the ack wait: JetStream gives them to the next worker
    /// that pulls, so they are pending again.
    pub(crate) due: u64,
    /// The silent holders, both kinds, the longest silent first.
    pub(crate) listed: Vec<SilentHolder>,
}

/// The ack wait of a delivery: the consumer's `ack_wait`, or with a
/// `--backoff` list its entry for that delivery (the last one after).
pub(crate) fn ack_wait_of(delivery: u64, ack_wait: Duration, backoff: &[Duration]) -> Duration {
    if backoff.is_empty() {
        return ack_wait;
    }
    let i = (delivery.max(1) - 1).min(backoff.len() as u64 - 1) as usize;
    backoff[i]
}

/// Sorts the running marks `marks` (task id, mark, heartbeat age), their
/// ages taken at one instant.
pub(crate) fn classify<'a>(
    marks: impl Iterator<Item = (&'a String, &'a TaskRunning, Option<Duration>)>,
    ack_wait: Duration,
    backoff: &[Duration],
) -> Holders {
    let mut h = Holders::default();
    for (task, mark, age) in marks {
        let Some(age) = age else {
            h.live += 1;
            continue;
        };
        let wait = ack_wait_of(mark.delivery, ack_wait, backoff).max(Duration::from_secs(1));
        if age <= wait * 2 / 3 {
            h.live += 1;
            continue;
        }
        if age > wait {
            h.due += 1;
        } else {
            h.silent += 1;
        }
        h.listed.push(SilentHolder {
            task_id: task.clone(),
            worker: mark.worker.clone(),
            delivery: mark.delivery,
            silent_s: round1(age.as_secs_f64()),
            redelivery_in_s: round1(wait.saturating_sub(age).as_secs_f64()),
        });
    }
    h.listed.sort_by(|a, b| {
        b.silent_s
            .total_cmp(&a.silent_s)
            .then(a.task_id.cmp(&b.task_id))
    });
    h.listed.truncate(SILENT_LISTED);
    h
}

fn round1(s: f64) -> f64 {
    (s * 10.0).round() / 10.0
}

/// One sentence on the silent holders for `status`'s text; `None` without.
pub(crate) fn describe(silent: u64, due: u64, listed: &[SilentHolder]) -> Option<String> {
    let first = listed.first()?;
    let n = silent + due;
    let next = listed
        .iter()
        .map(|h| h.redelivery_in_s)
        .fold(f64::INFINITY, f64::min);
    let when = if next > 0.0 {
        format!("JetStream redelivers it in about {}", secs(next))
    } else {
        "JetStream gives it to the next worker that pulls".to_owned()
    };
    Some(if n == 1 {
        format!(
            "1 task held by worker {} silent for {}: dead or stuck; {when}",
            first.worker,
            secs(first.silent_s)
        )
    } else {
        format!(
            "{n} tasks held by workers silent for up to {} ({} among them): dead or stuck; \
             the first: {when}",
            secs(first.silent_s),
            first.worker
        )
    })
}

fn secs(s: f64) -> String {
    format!("{} s", s.ceil() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(worker: &str, delivery: u64) -> TaskRunning {
        TaskRunning {
            worker: worker.into(),
            started_at: "2024-01-01T00:00:00Z".into(),
            delivery,
            heartbeat_at: Some("2024-01-01T00:00:00Z".into()),
        }
    }

    #[test]
    fn a_holder_silent_for_two_heartbeats_is_reported_with_its_redelivery() {
        let w = Duration::from_secs(60);
        let (a, b, c) = ("a".to_owned(), "b".to_owned(), "c".to_owned());
        let (live, dead, gone) = (mark("w1", 1), mark("w2", 1), mark("w3", 2));
        let h = classify(
            [
                (&a, &live, Some(Duration::from_secs(25))),
                (&b, &dead, Some(Duration::from_secs(52))),
                (&c, &gone, Some(Duration::from_secs(75))),
            ]
            .into_iter(),
            w,
            &[],
        );
        assert_eq!((h.live, h.silent, h.due), (1, 1, 1));
        assert_eq!(h.listed[0].task_id, "c");
        assert_eq!(h.listed[0].redelivery_in_s, 0.0);
        assert_eq!(h.listed[1].worker, "w2");
        assert_eq!(h.listed[1].silent_s, 52.0);
        assert_eq!(h.listed[1].redelivery_in_s, 8.0);

        let one = describe(1, 0, &h.listed[1..]).unwrap();
        assert_eq!(
            one,
            "1 task held by worker w2 silent for 52 s: dead or stuck; \
             JetStream redelivers it in about 8 s"
        );
        let both = describe(1, 1, &h.listed).unwrap();
        assert!(
            both.starts_with("2 tasks held by workers silent for up to 75 s (w3"),
            "{both}"
        );
        assert!(both.ends_with("the first: JetStream gives it to the next worker that pulls"));
        assert_eq!(describe(0, 0, &[]), None);
    }

    #[test]
    fn marks_without_a_heartbeat_count_as_live() {
        let t = "t".to_owned();
        let m = mark("old", 1);
        let h = classify([(&t, &m, None)].into_iter(), Duration::from_secs(3), &[]);
        assert_eq!((h.live, h.silent, h.due), (1, 0, 0));
    }

    #[test]
    fn backoff_sets_the_ack_wait_of_each_delivery() {
        let b = [Duration::from_secs(10), Duration::from_secs(60)];
        let w = Duration::from_secs(30);
        assert_eq!(ack_wait_of(1, w, &[]), w);
        assert_eq!(ack_wait_of(1, w, &b), b[0]);
        assert_eq!(ack_wait_of(2, w, &b), b[1]);
        assert_eq!(ack_wait_of(9, w, &b), b[1]);
        assert_eq!(ack_wait_of(0, w, &b), b[0]);
    }
}
