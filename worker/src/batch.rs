//! The batcher: collects the chips the readers send into batches of the
//! engine's preferred size, keeps up to [`BATCHES_IN_FLIGHT`] batches at the
//! engine, and turns its answers into chip rows (error rows pass through).
//! The task ([`crate::task`]) sorts and writes what it returns.

use std::sync::atomic::Ordering;

use futures::stream::FuturesOrdered;
use futures::{Future, StreamExt};
use rsembed_schemas::ids::chip_id;
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::engine::{PixelBatch, PixelFormat, Pixels};
use crate::error::{Error, Result};
use crate::input::{Item, Prepared};
use crate::metrics;
use crate::sink::rows::{CellColumns, CellRow, ChipRow, ErrorRow, StacColumns};
use crate::task::{StoreErrors, TaskRunner};

/// Batches one task keeps sent to the engine and not yet answered: one
/// running, one queued behind it, so the engine never waits for the batcher.
pub const BATCHES_IN_FLIGHT: usize = 2;

impl TaskRunner {
    /// Batches what arrives on `rx` until it closes and every batch is
    /// answered: the task's chip rows and error rows, unsorted.
    pub(crate) async fn batch_and_embed(
        &self,
        mut rx: mpsc::Receiver<Item>,
        tiling_fp: &str,
    ) -> Result<(Vec<CellRow>, Vec<ErrorRow>)> {
        let mut rows: Vec<CellRow> = Vec::new();
        let mut failures: Vec<ErrorRow> = Vec::new();
        let mut pending: Vec<Prepared> = Vec::with_capacity(self.batch_size);
        let mut in_flight = FuturesOrdered::new();
        let mut receiving = true;
        loop {
            // The adaptive engine's current bucket, so batches arrive the size it
            // runs best; a fixed batch size otherwise.
            let target = self
                .engine
                .preferred_batch()
                .unwrap_or(self.batch_size)
                .clamp(1, self.batch_size.max(1));
            let ready = pending.len() >= target || (!receiving && !pending.is_empty());
            if ready && in_flight.len() < BATCHES_IN_FLIGHT {
                let batch = std::mem::take(&mut pending);
                in_flight.push_back(self.embed_batch(batch, target, tiling_fp));
            }
            if !receiving && pending.is_empty() && in_flight.is_empty() {
                break;
            }
            // Here either a batch is in flight, or the input is still open and
            // `pending` has room (a full `pending` was sent above unless the
            // engine already has BATCHES_IN_FLIGHT batches): a branch is live.
            tokio::select! {
                biased;
                // Answers first: they free the most memory.
                Some(done) = in_flight.next(), if !in_flight.is_empty() => {
                    // A fatal engine error fails the task; the other batch in
                    // flight is dropped with it.
                    rows.extend(done?);
                }
                item = rx.recv(), if receiving && pending.len() < target => match item {
                    Some(Ok(p)) => pending.push(p),
                    Some(Err(e)) if e.store.is_some() && self.store_errors == StoreErrors::FailTask => {
                        // Not the input's fault: the task fails with the
                        // store's error (and its hint) rather than recording
                        // a "bad input" row no rerun would revisit.
                        return Err(Error::InputUnavailable {
                            uri: e.source_uri,
                            source: e.cause.unwrap_or_else(|| e.error.into()),
                        });
                    }
                    Some(Err(mut e)) => {
                        // Recorded as a row: the error itself is not needed.
                        e.cause = None;
                        self.counters.failed.fetch_add(1, Ordering::Relaxed);
                        metrics::global().failed_inputs.inc_by(1);
                        failures.push(e);
                    }
                    None => receiving = false,
                },
                else => {
                    return Err(Error::EngineGone(
                        "batcher has nothing to wait for; this is a bug".into(),
                    ))
                }
            }
        }
        Ok((rows, failures))
    }

    /// Moves the pixels of `batch` into one request now and returns the
    /// future that sends it to the engine and turns the answer into rows, in
    /// batch order. The future runs in a `batch` span.
    fn embed_batch<'a>(
        &'a self,
        mut batch: Vec<Prepared>,
        bucket: usize,
        tiling_fp: &'a str,
    ) -> impl Future<Output = Result<Vec<CellRow>>> + 'a {
        let n = batch.len();
        let (h, w) = (
            self.preprocessor.height() as usize,
            self.preprocessor.width() as usize,
        );
        let len = self.preprocessor.len();
        // A uint8 entry takes the 8-bit images as they are (a quarter of the
        // bytes); a float one, rescaled and normalized here. Into a buffer the
        // engine lends when it lends one (bound as the session's input with
        // no further copy; page-locked on CUDA), else into our own.
        let leased = self
            .engine
            .input_pool()
            .and_then(|pool| pool.lease(n))
            .and_then(|mut l| {
                let ok = match l.format() {
                    PixelFormat::U8Nhwc => l.u8_mut().map(|out| {
                        for (p, o) in batch.iter().zip(out.chunks_exact_mut(len)) {
                            o.copy_from_slice(&p.pixels);
                        }
                    }),
                    PixelFormat::F32Nchw => l.f32_mut().map(|out| {
                        for (p, o) in batch.iter().zip(out.chunks_exact_mut(len)) {
                            self.preprocessor.normalize_into(&p.pixels, o);
                        }
                    }),
                };
                ok.map(|()| Pixels::Leased(l))
            });
        let data = match leased {
            Some(d) => d,
            None => match self.engine.pixel_format() {
                PixelFormat::U8Nhwc => {
                    let mut data = Vec::with_capacity(n * len);
                    for p in &batch {
                        data.extend_from_slice(&p.pixels);
                    }
                    Pixels::U8(data)
                }
                PixelFormat::F32Nchw => {
                    let mut data = vec![0f32; n * len];
                    for (p, out) in batch.iter().zip(data.chunks_exact_mut(len)) {
                        self.preprocessor.normalize_into(&p.pixels, out);
                    }
                    Pixels::F32(data)
                }
            },
        };
        for p in &mut batch {
            // Each chip's pixels live once, in the request.
            p.pixels = Vec::new();
            p.queued.release();
        }
        let pixels = PixelBatch {
            n,
            channels: 3,
            height: h,
            width: w,
            data,
        };
        let at_engine = metrics::global().queue_batches.hold(1);
        let span = tracing::debug_span!("batch", images = n, bucket);
        async move {
            let emb = self.engine.embed(pixels).await?;
            drop(at_engine);
            let rows: Vec<CellRow> = batch
                .into_iter()
                .enumerate()
                .map(|(i, p)| CellRow {
                    chip: ChipRow {
                        // A composite's row is named by its own identity.
                        stac: p.identity.as_ref().map_or_else(
                            || StacColumns::of(&p.input, p.cloud_fraction),
                            |id| id.stac.clone(),
                        ),
                        chip_id: p.identity.as_ref().map_or_else(
                            || {
                                chip_id(
                                    &p.input.uri,
                                    p.input.version.as_deref(),
                                    p.window,
                                    tiling_fp,
                                )
                            },
                            |id| id.chip_id.clone(),
                        ),
                        source_uri: p.input.uri,
                        source_version: p.input.version,
                        window: p.window,
                        valid_fraction: p.valid_fraction,
                        crs: p.crs,
                        footprint: p.footprint,
                        centre: p.centre,
                        embedding: emb.row(i).to_vec(),
                    },
                    cells: CellColumns {
                        cell: p.cell,
                        ..CellColumns::default()
                    },
                })
                .collect();
            self.counters.chips.fetch_add(n as u64, Ordering::Relaxed);
            metrics::global().chips.inc_by(n as u64);
            tracing::debug!(images = n, "batch embedded");
            Ok(rows)
        }
        .instrument(span)
    }
}
