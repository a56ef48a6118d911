//! The metrics endpoint: `GET /metrics` answers the registry in the text
//! format (`text/plain; version=0.0.4`); anything else is a 404.
//!
//! One small task per connection, each with a deadline, so a slow or silent
//! client holds nothing but its own socket; rendering is a few dozen atomic
//! loads, so it never blocks the runtime. HTTP/1.0 style: one request per
//! connection, closed after the answer.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, ToSocketAddrs};
use tokio_util::sync::CancellationToken;

use crate::metrics::Registry;

/// The content type of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The longest request head read; longer requests are answered 431.
const MAX_HEAD: usize = 8 << 10;
/// How long one connection may take, from accept to the last byte written.
const DEADLINE: Duration = Duration::from_secs(10);

/// Binds `addr` and serves `registry` on it until `shutdown` is cancelled.
/// Returns the bound address (useful with port 0) once it listens, so a bind
/// error comes back to the caller rather than to a log.
pub async fn start(
    addr: impl ToSocketAddrs,
    registry: &'static Registry,
    shutdown: CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let task = tokio::spawn(serve(listener, registry, shutdown));
    Ok((local, task))
}

/// Accepts connections on `listener` until `shutdown` is cancelled.
pub async fn serve(
    listener: TcpListener,
    registry: &'static Registry,
    shutdown: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => return,
            a = listener.accept() => a,
        };
        match accepted {
            Ok((stream, peer)) => {
                tokio::spawn(async move {
                    match tokio::time::timeout(DEADLINE, answer(stream, registry)).await {
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

async fn answer(mut stream: TcpStream, registry: &'static Registry) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    let complete = loop {
        if head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n") {
            break true;
        }
        if head.len() > MAX_HEAD {
            break false;
        }
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break !head.is_empty();
        }
        head.extend_from_slice(&buf[..n]);
    };
    let (status, content_type, body) = if !complete {
        (
            "431 Request Header Fields Too Large",
            "text/plain",
            String::new(),
        )
    } else {
        route(&head, registry)
    };
    let is_head = head.starts_with(b"HEAD ");
    let mut response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if !is_head {
        response.extend_from_slice(body.as_bytes());
    }
    stream.write_all(&response).await?;
    stream.shutdown().await
}

fn route(head: &[u8], registry: &Registry) -> (&'static str, &'static str, String) {
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET" | "HEAD", "/metrics") => ("200 OK", CONTENT_TYPE, registry.render()),
        _ => ("404 Not Found", "text/plain", "not found\n".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::names;
    use std::collections::HashMap;

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
        let (addr, task) = start("127.0.0.1:0", reg, stop.clone()).await.unwrap();

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
            "garbage\r\n\r\n",
        ] {
            let (status, _, body) = get(addr, req).await;
            assert_eq!(status, "HTTP/1.1 404 Not Found", "{req:?}");
            assert_eq!(body, "not found\n");
        }
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
        let (addr, _task) = start("127.0.0.1:0", reg, stop.clone()).await.unwrap();
        let _silent = TcpStream::connect(addr).await.unwrap();
        let (status, _, _) = get(addr, "GET /metrics HTTP/1.1\r\n\r\n").await;
        assert_eq!(status, "HTTP/1.1 200 OK");
        stop.cancel();
    }
}
