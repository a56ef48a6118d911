//! The worker's HTTP endpoint: `GET /metrics` answers the registry in the
//! text format (`text/plain; version=0.0.4`), `/healthz` says the process is
//! alive, `/readyz` whether it can take work ([`Health`]); anything else is a
//! 404.
//!
//! HTTP/1 is hyper's (docs/decisions.md): one task per connection, a bounded
//! request head (longer is a 431), a deadline for the head and one for the
//! whole connection, so a slow or silent client holds nothing but its own
//! socket. Rendering is a few dozen atomic loads, so it never blocks the
//! runtime. One request per connection, closed after the answer.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE as CONTENT_TYPE_HEADER};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream, ToSocketAddrs};
use tokio_util::sync::CancellationToken;

use crate::metrics::Registry;
use crate::queue::{ConnectionProblem, ConnectionWatch};

/// The content type of the text exposition format.
pub(crate) const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Liveness: the process answers. Probes and the Helm chart use these paths.
pub const HEALTHZ_PATH: &str = "/healthz";
/// Readiness: model loaded, probe done, NATS connected, not draining.
pub const READYZ_PATH: &str = "/readyz";
/// Prometheus text format.
pub const METRICS_PATH: &str = "/metrics";

/// The most a connection buffers of a request; a head that does not fit is
/// answered 431. hyper's smallest allowed limit, far above what probes and
/// Prometheus send.
const MAX_HEAD: usize = 8 << 10;
/// How long a client may take to send the request head.
const HEAD_DEADLINE: Duration = Duration::from_secs(5);
/// How long one connection may take, from accept to the last byte written.
const DEADLINE: Duration = Duration::from_secs(10);

/// What `/readyz` answers: a worker is ready once its model is loaded, the
/// warm-up probe has picked the batch size and NATS is connected, and stops
/// being ready when it starts draining (SIGTERM) or loses NATS. Liveness
/// (`/healthz`) is only that the process answers: a worker reconnecting to
/// NATS is not stuck, and restarting it would lose its warm-up.
#[derive(Debug, Default)]
pub struct Health {
    model: AtomicBool,
    probe: AtomicBool,
    draining: AtomicBool,
    nats: OnceLock<async_nats::Client>,
    nats_watch: OnceLock<ConnectionWatch>,
}

impl Health {
    /// A process that is coming up: not ready.
    pub fn new() -> Arc<Health> {
        Arc::new(Health::default())
    }

    /// The model's graphs are loaded.
    pub fn set_model_loaded(&self) {
        self.model.store(true, Ordering::Release);
    }

    /// The warm-up probe is done (the batch size is chosen).
    pub fn set_probe_done(&self) {
        self.probe.store(true, Ordering::Release);
    }

    /// The NATS connection whose state readiness follows.
    pub fn set_nats(&self, client: async_nats::Client) {
        let _ = self.nats.set(client);
    }

    /// The client events that say why NATS is down (see
    /// [`NatsArgs::connect_watched`](crate::queue::NatsArgs::connect_watched)).
    pub fn set_nats_watch(&self, watch: ConnectionWatch) {
        let _ = self.nats_watch.set(watch);
    }

    /// The process drains: it takes no new task.
    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// What keeps the process from being ready; empty when it is.
    pub(crate) fn not_ready(&self) -> Vec<&'static str> {
        let mut why = Vec::new();
        if !self.model.load(Ordering::Acquire) {
            why.push("model not loaded");
        }
        if !self.probe.load(Ordering::Acquire) {
            why.push("warm-up probe not done");
        }
        match self.nats.get().map(|c| c.connection_state()) {
            None => why.push("NATS not connected yet"),
            Some(async_nats::connection::State::Connected) => {}
            // A refused credential or certificate does not heal by
            // retrying: say so, since the operator must act.
            Some(_) => why.push(
                match self.nats_watch.get().map(ConnectionWatch::problem) {
                    Some(ConnectionProblem::Authorization) => {
                        "NATS disconnected: authorization failed (the server refuses this worker's credentials)"
                    }
                    Some(ConnectionProblem::Tls) => "NATS disconnected: TLS handshake failed",
                    _ => "NATS disconnected",
                },
            ),
        }
        if self.draining.load(Ordering::Acquire) {
            why.push("draining");
        }
        why
    }
}

/// Binds `addr` and serves `registry` (and, with `health`, `/readyz`) on it
/// until `shutdown` is cancelled. Returns the bound address (useful with port
/// 0) once it listens, so a bind error comes back to the caller rather than
/// to a log.
pub async fn start(
    addr: impl ToSocketAddrs,
    registry: &'static Registry,
    health: Option<Arc<Health>>,
    shutdown: CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let task = tokio::spawn(serve(listener, registry, health, shutdown));
    Ok((local, task))
}

/// Accepts connections on `listener` until `shutdown` is cancelled.
pub(crate) async fn serve(
    listener: TcpListener,
    registry: &'static Registry,
    health: Option<Arc<Health>>,
    shutdown: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => return,
            a = listener.accept() => a,
        };
        match accepted {
            Ok((stream, peer)) => {
                let health = health.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(DEADLINE, connection(stream, registry, health)).await
                    {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, cause = %e, "metrics connection failed")
                        }
                        Err(_) => tracing::debug!(%peer, "metrics connection timed out"),
                    }
                });
            }
            Err(e) => {
                // Out of file descriptors and the like: back off, keep serving.
                tracing::warn!(cause = %e, "metrics endpoint cannot accept");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Serves one connection with hyper's HTTP/1.
async fn connection(
    stream: TcpStream,
    registry: &'static Registry,
    health: Option<Arc<Health>>,
) -> hyper::Result<()> {
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let answer = route(req.method(), req.uri().path(), registry, health.as_deref());
        async move { Ok::<_, Infallible>(answer) }
    });
    hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEAD_DEADLINE)
        .max_buf_size(MAX_HEAD)
        .keep_alive(false)
        .serve_connection(TokioIo::new(stream), service)
        .await
}

/// The answer to one request. hyper leaves the body out for `HEAD` and sets
/// `Content-Length` from it.
fn route(
    method: &Method,
    path: &str,
    registry: &Registry,
    health: Option<&Health>,
) -> Response<Full<Bytes>> {
    let text = "text/plain";
    let (status, content_type, body) = if method != Method::GET && method != Method::HEAD {
        (StatusCode::NOT_FOUND, text, "not found\n".to_owned())
    } else {
        match path {
            METRICS_PATH => (StatusCode::OK, CONTENT_TYPE, registry.render()),
            HEALTHZ_PATH => (StatusCode::OK, text, "ok\n".to_owned()),
            READYZ_PATH if health.is_some() => {
                let why = health.map(Health::not_ready).unwrap_or_default();
                if why.is_empty() {
                    (StatusCode::OK, text, "ready\n".to_owned())
                } else {
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        text,
                        format!("not ready: {}\n", why.join(", ")),
                    )
                }
            }
            _ => (StatusCode::NOT_FOUND, text, "not found\n".to_owned()),
        }
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE_HEADER, HeaderValue::from_static(content_type));
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::names;
    use std::collections::HashMap;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// One request over a real socket; returns the status line, the headers
    /// (lower-cased names) and the body.
    async fn get(addr: SocketAddr, request: &str) -> (String, HashMap<String, String>, String) {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(request.as_bytes()).await.unwrap();
        let mut raw = String::new();
        s.read_to_string(&mut raw).await.unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").expect("a complete response");
        let mut lines = head.split("\r\n");
        let status = lines.next().unwrap().to_owned();
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        (status, headers, body.to_owned())
    }

    /// The text format, parsed: `# TYPE` per family and the value per series.
    fn parse(text: &str) -> (HashMap<String, String>, HashMap<String, f64>) {
        let mut types = HashMap::new();
        let mut values = HashMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert!(
                    types.insert(name.to_owned(), kind.to_owned()).is_none(),
                    "{name} twice"
                );
            } else if line.starts_with('#') || line.is_empty() {
                continue;
            } else {
                let (series, v) = line.rsplit_once(' ').unwrap();
                let family = series.split('{').next().unwrap();
                let base = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| family.strip_suffix(s))
                    .filter(|b| types.get(*b).is_some_and(|t| t == "histogram"))
                    .unwrap_or(family);
                assert!(types.contains_key(base), "{series} has no # TYPE before it");
                values.insert(series.to_owned(), v.parse().unwrap());
            }
        }
        (types, values)
    }

    #[tokio::test]
    async fn serves_the_text_format_over_tcp_and_404s_the_rest() {
        let reg: &'static Registry = Box::leak(Box::new(Registry::new()));
        let stop = CancellationToken::new();
        let (addr, task) = start("127.0.0.1:0", reg, None, stop.clone()).await.unwrap();

        reg.chips.inc_by(41);
        reg.chips.inc_by(1);
        reg.failed_inputs.inc_by(2);
        reg.batch_size.set(16);
        reg.batch_ceiling.set(32);
        reg.queue_chips.set(7);
        reg.inference_seconds.observe(0.2);
        reg.inference_seconds.observe(3.0);

        let (status, headers, body) = get(
            addr,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n",
        )
        .await;
        assert_eq!(status, "HTTP/1.1 200 OK");
        assert_eq!(headers["content-type"], CONTENT_TYPE);
        assert_eq!(headers["content-length"], body.len().to_string());
        let (types, values) = parse(&body);
        for (name, kind) in [
            (names::CHIPS_TOTAL, "counter"),
            (names::FAILED_INPUTS_TOTAL, "counter"),
            (names::OOM_TOTAL, "counter"),
            (names::BATCH_SIZE, "gauge"),
            (names::BATCH_CEILING, "gauge"),
            (names::QUEUE_CHIPS, "gauge"),
            (names::QUEUE_BATCHES, "gauge"),
            (names::QUEUE_TASKS, "gauge"),
            (names::INFERENCE_SECONDS, "histogram"),
        ] {
            assert_eq!(types.get(name).map(String::as_str), Some(kind), "{name}");
        }
        assert!(!types.contains_key(names::GPU_MEMORY_USED), "no NVML here");
        assert_eq!(values[names::CHIPS_TOTAL], 42.0);
        assert_eq!(values[names::FAILED_INPUTS_TOTAL], 2.0);
        assert_eq!(values[names::OOM_TOTAL], 0.0);
        assert_eq!(values[names::BATCH_SIZE], 16.0);
        assert_eq!(values[names::BATCH_CEILING], 32.0);
        assert_eq!(values[names::QUEUE_CHIPS], 7.0);
        let h = names::INFERENCE_SECONDS;
        assert_eq!(values[&format!("{h}_bucket{{le=\"0.25\"}}")], 1.0);
        assert_eq!(values[&format!("{h}_bucket{{le=\"5\"}}")], 2.0);
        assert_eq!(values[&format!("{h}_bucket{{le=\"+Inf\"}}")], 2.0);
        assert_eq!(values[&format!("{h}_count")], 2.0);
        assert!((values[&format!("{h}_sum")] - 3.2).abs() < 1e-9);

        // A later scrape sees later values; a query string is ignored.
        reg.chips.inc_by(8);
        let (_, _, body) = get(addr, "GET /metrics?x=1 HTTP/1.0\r\n\r\n").await;
        assert_eq!(parse(&body).1[names::CHIPS_TOTAL], 50.0);

        for req in [
            "GET / HTTP/1.1\r\n\r\n",
            "GET /metricsx HTTP/1.1\r\n\r\n",
            "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
        ] {
            let (status, _, body) = get(addr, req).await;
            assert_eq!(status, "HTTP/1.1 404 Not Found", "{req:?}");
            assert_eq!(body, "not found\n");
        }
        let (status, _, _) = get(addr, "garbage\r\n\r\n").await;
        assert_eq!(status, "HTTP/1.1 400 Bad Request");
        let (status, headers, body) = get(addr, "HEAD /metrics HTTP/1.1\r\n\r\n").await;
        assert_eq!(status, "HTTP/1.1 200 OK");
        assert!(body.is_empty());
        assert!(headers["content-length"].parse::<usize>().unwrap() > 0);

        stop.cancel();
        task.await.unwrap();
        assert!(
            TcpStream::connect(addr).await.is_err(),
            "closed after shutdown"
        );
    }

    #[tokio::test]
    async fn a_silent_client_does_not_hold_up_others() {
        let reg: &'static Registry = Box::leak(Box::new(Registry::new()));
        let stop = CancellationToken::new();
        let (addr, _task) = start("127.0.0.1:0", reg, None, stop.clone()).await.unwrap();
        let _silent = TcpStream::connect(addr).await.unwrap();
        let (status, _, _) = get(addr, "GET /metrics HTTP/1.1\r\n\r\n").await;
        assert_eq!(status, "HTTP/1.1 200 OK");
        stop.cancel();
    }

    #[tokio::test]
    async fn an_oversized_head_is_refused_and_others_still_answered() {
        let reg: &'static Registry = Box::leak(Box::new(Registry::new()));
        let stop = CancellationToken::new();
        let (addr, _task) = start("127.0.0.1:0", reg, None, stop.clone()).await.unwrap();
        // Far past MAX_HEAD, sent without ever ending the head: the server
        // must answer from what it has rather than buffer on.
        let huge = format!(
            "GET /metrics HTTP/1.1\r\nX-Pad: {}\r\n",
            "a".repeat(4 * MAX_HEAD)
        );
        let mut s = TcpStream::connect(addr).await.unwrap();
        // The server may close before taking it all; the answer still comes.
        let _ = s.write_all(huge.as_bytes()).await;
        let mut raw = Vec::new();
        let _ = s.read_to_end(&mut raw).await;
        let raw = String::from_utf8_lossy(&raw);
        assert!(
            raw.starts_with("HTTP/1.1 431 Request Header Fields Too Large"),
            "{raw}"
        );
        let (status, _, _) = get(addr, "GET /healthz HTTP/1.1\r\n\r\n").await;
        assert_eq!(status, "HTTP/1.1 200 OK");
        stop.cancel();
    }

    #[tokio::test]
    async fn readiness_follows_model_probe_and_draining() {
        let reg: &'static Registry = Box::leak(Box::new(Registry::new()));
        let stop = CancellationToken::new();
        let health = Health::new();
        let (addr, _task) = start("127.0.0.1:0", reg, Some(health.clone()), stop.clone())
            .await
            .unwrap();
        let (status, _, body) = get(addr, "GET /healthz HTTP/1.1\r\n\r\n").await;
        assert_eq!(
            (status.as_str(), body.as_str()),
            ("HTTP/1.1 200 OK", "ok\n")
        );
        let (status, _, body) = get(addr, "GET /readyz HTTP/1.1\r\n\r\n").await;
        assert_eq!(status, "HTTP/1.1 503 Service Unavailable");
        assert_eq!(
            body,
            "not ready: model not loaded, warm-up probe not done, NATS not connected yet\n"
        );
        health.set_model_loaded();
        health.set_probe_done();
        let (_, _, body) = get(addr, "GET /readyz HTTP/1.1\r\n\r\n").await;
        assert_eq!(body, "not ready: NATS not connected yet\n");
        health.set_draining();
        assert_eq!(
            health.not_ready(),
            vec!["NATS not connected yet", "draining"]
        );
        stop.cancel();
    }

    #[tokio::test]
    async fn without_health_readyz_is_not_served() {
        let reg: &'static Registry = Box::leak(Box::new(Registry::new()));
        let stop = CancellationToken::new();
        let (addr, _task) = start("127.0.0.1:0", reg, None, stop.clone()).await.unwrap();
        let (status, _, _) = get(addr, "GET /readyz HTTP/1.1\r\n\r\n").await;
        assert_eq!(status, "HTTP/1.1 404 Not Found");
        stop.cancel();
    }
}
