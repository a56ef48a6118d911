//! The engine thread: one OS thread owns the model; async code talks to it
//! through a bounded queue and gets each answer on a oneshot.
//!
//! After building the backend and after each request, the thread publishes
//! into [`crate::metrics::global`]: the request's wall time, the backend's
//! preferred batch, device memory (one NVML query, on CUDA) and the adaptive
//! statistics.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;

use crate::engine::pool::InputPool;
use crate::engine::{Backend, Embeddings, PixelBatch, PixelFormat};
use crate::error::{Error, Result};

enum Request {
    Embed {
        batch: PixelBatch,
        reply: oneshot::Sender<Result<Embeddings>>,
        span: tracing::Span,
    },
    /// Drop the backend (ORT writes its profile, frees its arena) and stop.
    Shutdown(oneshot::Sender<()>),
}

/// A cloneable handle to the engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<Request>,
    max_batch: Option<usize>,
    /// The pixels the backend takes.
    pixel_format: PixelFormat,
    /// Buffers the backend lends to assemble batches in.
    pool: Option<InputPool>,
    /// The backend's preferred batch after its latest request; 0 is none.
    preferred: Arc<AtomicUsize>,
    /// Nanoseconds the thread spent answering requests.
    busy_ns: Arc<AtomicU64>,
    /// When the backend was ready (after its warm-up probe).
    ready_at: Instant,
}

impl EngineHandle {
    /// Starts the engine thread. `factory` runs on that thread, so a backend
    /// whose session must not move between threads never does. Returns once the
    /// backend is built, with its error if it could not be.
    pub fn spawn<B, F>(name: &str, queue: usize, factory: F) -> Result<EngineHandle>
    where
        B: Backend + 'static,
        F: FnOnce() -> Result<B> + Send + 'static,
    {
        let (tx, mut rx) = mpsc::channel::<Request>(queue.max(1));
        let (ready_tx, ready_rx) =
            std::sync::mpsc::channel::<Result<(Option<usize>, PixelFormat, Option<InputPool>)>>();
        let preferred = Arc::new(AtomicUsize::new(0));
        let publish = preferred.clone();
        let busy_ns = Arc::new(AtomicU64::new(0));
        let busy = busy_ns.clone();
        std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                let mut backend = match factory() {
                    Ok(b) => {
                        publish.store(b.preferred_batch().unwrap_or(0), Ordering::Relaxed);
                        crate::metrics::global().observe_backend(&b);
                        let _ =
                            ready_tx.send(Ok((b.max_batch(), b.pixel_format(), b.input_pool())));
                        b
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                // The request after the one running, taken off the queue early
                // so the backend can stage its batch while this one runs.
                let mut next: Option<Request> = None;
                loop {
                    let req = match next.take() {
                        Some(r) => r,
                        None => match rx.blocking_recv() {
                            Some(r) => r,
                            None => break,
                        },
                    };
                    let (batch, reply, span) = match req {
                        Request::Embed { batch, reply, span } => (batch, reply, span),
                        Request::Shutdown(done) => {
                            drop(backend);
                            let _ = done.send(());
                            return;
                        }
                    };
                    let _enter = span.enter();
                    let started = Instant::now();
                    if let Ok(r) = rx.try_recv() {
                        if let Request::Embed { batch: after, .. } = &r {
                            backend.stage(after);
                        }
                        next = Some(r);
                    }
                    let out = backend.embed(&batch);
                    let took = started.elapsed();
                    busy.fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
                    let seconds = took.as_secs_f64();
                    publish.store(backend.preferred_batch().unwrap_or(0), Ordering::Relaxed);
                    let metrics = crate::metrics::global();
                    metrics.inference_seconds.observe(seconds);
                    metrics.observe_backend(&backend);
                    tracing::debug!(images = batch.n, seconds, ok = out.is_ok(), "engine run");
                    // The caller may have given up (cancellation); that is not our error.
                    let _ = reply.send(out);
                }
            })
            .map_err(Error::Io)?;
        let (max_batch, pixel_format, pool) = ready_rx
            .recv()
            .map_err(|_| Error::EngineGone("engine thread died while starting".into()))??;
        Ok(EngineHandle {
            tx,
            max_batch,
            pixel_format,
            pool,
            preferred,
            busy_ns,
            ready_at: Instant::now(),
        })
    }

    /// Time the engine thread spent running requests (the model, the
    /// host↔device copies and padding included), and the time since the
    /// backend was ready: their ratio is how busy a run kept the device.
    pub fn busy(&self) -> (Duration, Duration) {
        (
            Duration::from_nanos(self.busy_ns.load(Ordering::Relaxed)),
            self.ready_at.elapsed(),
        )
    }

    /// The backend's batch limit, if it has one.
    pub fn max_batch(&self) -> Option<usize> {
        self.max_batch
    }

    /// The pixels the backend takes: the batcher assembles batches in it.
    pub fn pixel_format(&self) -> PixelFormat {
        self.pixel_format
    }

    /// The buffers the backend lends to assemble batches in, if it lends any.
    pub fn input_pool(&self) -> Option<&InputPool> {
        self.pool.as_ref()
    }

    /// The batch size the backend runs best at now (the adaptive bucket), as
    /// of its latest request; the batcher fills batches to it. `None` when the
    /// backend has no preference (a fixed `--batch-size`).
    pub fn preferred_batch(&self) -> Option<usize> {
        Some(self.preferred.load(Ordering::Relaxed)).filter(|n| *n > 0)
    }

    /// Requests waiting in the engine's queue (not counting the one running
    /// or the one taken off the queue to be staged).
    pub fn queued(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }

    /// Embeds one batch, waiting for room in the queue first.
    pub async fn embed(&self, batch: PixelBatch) -> Result<Embeddings> {
        let (reply, rx) = oneshot::channel();
        let span = tracing::Span::current();
        self.tx
            .send(Request::Embed { batch, reply, span })
            .instrument(tracing::trace_span!("engine_queue"))
            .await
            .map_err(|_| Error::EngineGone("engine queue closed".into()))?;
        rx.await
            .map_err(|_| Error::EngineGone("engine thread dropped a request".into()))?
    }

    /// Drops the backend on its thread after the requests already queued, and
    /// waits for it: a process must not exit while ORT still writes its
    /// profile or holds device memory. Later requests fail with `EngineGone`.
    pub async fn shutdown(&self) {
        let (done, rx) = oneshot::channel();
        if self.tx.send(Request::Shutdown(done)).await.is_ok() {
            let _ = rx.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Echo;
    impl Backend for Echo {
        fn run(&mut self, batch: &PixelBatch, _: crate::engine::RunHints) -> Result<Embeddings> {
            let data = (0..batch.n)
                .flat_map(|i| [batch.data.value(i * batch.image_len()).unwrap(), 1.0])
                .collect();
            Ok(Embeddings {
                n: batch.n,
                dim: 2,
                data,
            })
        }
    }

    #[tokio::test]
    async fn answers_in_order_from_its_own_thread() {
        let h = EngineHandle::spawn("test-engine", 2, || Ok(Echo)).unwrap();
        let batch = PixelBatch {
            n: 2,
            channels: 1,
            height: 1,
            width: 1,
            data: vec![5.0, 7.0].into(),
        };
        let e = h.embed(batch).await.unwrap();
        assert_eq!(e.data, vec![5.0, 1.0, 7.0, 1.0]);
    }

    #[tokio::test]
    async fn publishes_the_backends_preferred_batch_after_each_request() {
        struct Pref(usize);
        impl Backend for Pref {
            fn run(&mut self, b: &PixelBatch, h: crate::engine::RunHints) -> Result<Embeddings> {
                self.0 = b.n * 2;
                Echo.run(b, h)
            }
            fn preferred_batch(&self) -> Option<usize> {
                Some(self.0)
            }
        }
        let h = EngineHandle::spawn("test-engine", 1, || Ok(Pref(4))).unwrap();
        assert_eq!(h.preferred_batch(), Some(4));
        let batch = PixelBatch {
            n: 3,
            channels: 1,
            height: 1,
            width: 1,
            data: vec![1.0, 2.0, 3.0].into(),
        };
        h.embed(batch).await.unwrap();
        assert_eq!(h.preferred_batch(), Some(6));
        let plain = EngineHandle::spawn("test-engine", 1, || Ok(Echo)).unwrap();
        assert_eq!(plain.preferred_batch(), None);
    }

    #[tokio::test]
    async fn counts_the_time_spent_on_requests() {
        struct Slow;
        impl Backend for Slow {
            fn run(&mut self, b: &PixelBatch, h: crate::engine::RunHints) -> Result<Embeddings> {
                std::thread::sleep(std::time::Duration::from_millis(30));
                Echo.run(b, h)
            }
        }
        let h = EngineHandle::spawn("test-engine", 1, || Ok(Slow)).unwrap();
        assert_eq!(h.busy().0, Duration::ZERO);
        let batch = PixelBatch {
            n: 1,
            channels: 1,
            height: 1,
            width: 1,
            data: vec![1.0].into(),
        };
        h.embed(batch.clone()).await.unwrap();
        h.embed(batch).await.unwrap();
        let (busy, since) = h.busy();
        assert!(busy >= Duration::from_millis(60), "{busy:?}");
        assert!(since >= busy, "{since:?} < {busy:?}");
    }

    /// Logs its runs and stages by the first value of each batch; its first
    /// run signals that it started and waits for the gate.
    struct Gated {
        log: Arc<std::sync::Mutex<Vec<String>>>,
        started: Option<std::sync::mpsc::Sender<()>>,
        gate: Option<std::sync::mpsc::Receiver<()>>,
    }
    impl Backend for Gated {
        fn run(&mut self, b: &PixelBatch, h: crate::engine::RunHints) -> Result<Embeddings> {
            if let (Some(s), Some(g)) = (self.started.take(), self.gate.take()) {
                s.send(()).unwrap();
                g.recv().unwrap();
            }
            let id = b.data.value(0).unwrap();
            self.log.lock().unwrap().push(format!("run {id}"));
            Echo.run(b, h)
        }
        fn stage(&mut self, next: &PixelBatch) {
            let id = next.data.value(0).unwrap();
            self.log.lock().unwrap().push(format!("stage {id}"));
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_batch_queued_next_is_staged_before_the_run_ahead_of_it() {
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (started_tx, started) = std::sync::mpsc::channel();
        let (open, gate) = std::sync::mpsc::channel();
        let backend = Gated {
            log: log.clone(),
            started: Some(started_tx),
            gate: Some(gate),
        };
        let h = EngineHandle::spawn("test-engine", 8, move || Ok(backend)).unwrap();
        let one = |id: f32| PixelBatch {
            n: 1,
            channels: 1,
            height: 1,
            width: 1,
            data: vec![id].into(),
        };
        let send = |id: f32| {
            let h = h.clone();
            let b = one(id);
            tokio::spawn(async move { h.embed(b).await.unwrap().data[0] })
        };
        let first = send(1.0);
        // The first run started with nothing queued behind it.
        tokio::task::spawn_blocking(move || started.recv().unwrap())
            .await
            .unwrap();
        let rest: Vec<_> = [2.0, 3.0, 4.0].into_iter().map(send).collect();
        while h.queued() < 3 {
            tokio::task::yield_now().await;
        }
        open.send(()).unwrap();
        assert_eq!(first.await.unwrap(), 1.0);
        for (t, id) in rest.into_iter().zip([2.0, 3.0, 4.0]) {
            assert_eq!(t.await.unwrap(), id, "each answer is its own batch's");
        }
        assert_eq!(
            *log.lock().unwrap(),
            ["run 1", "stage 3", "run 2", "stage 4", "run 3", "run 4"]
        );
    }

    #[test]
    fn factory_error_comes_back() {
        let r = EngineHandle::spawn::<Echo, _>("test-engine", 1, || {
            Err(Error::EngineGone("no model".into()))
        });
        assert!(r.is_err());
    }
}
