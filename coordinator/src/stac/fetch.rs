//! Bounded reads of STAC documents: every document, API page and line is read
//! with a byte cap, so a hostile or broken server (an endless body, a page of
//! gigabytes) costs at most the cap in memory and ends in a clear error.
//!
//! http(s) goes through `reqwest` (the API needs methods, bodies and headers
//! that object_store's HTTP store does not send); every other scheme (local
//! paths, `file://`, `s3://`, `gs://`, `az://`) through the object store.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::ObjectStoreExt;
use rsembed_worker::store::StoreCache;
use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// One catalog, collection, item or landing page. Real ones are kilobytes; a
/// collection listing thousands of item links is a few MiB.
pub const MAX_DOCUMENT: usize = 64 << 20;
/// One API page. Earth Search's largest page (limit 10 000 items of ~10 KiB)
/// is ~100 MiB; we ask for 250 items, a few MiB, so 64 MiB leaves room for
/// fat items and still bounds a server that ignores `limit`.
pub const MAX_PAGE: usize = 64 << 20;
/// A `.json` FeatureCollection, read whole to parse it. Bigger collections
/// belong in `.ndjson` or stac-geoparquet, which stream.
pub const MAX_ITEM_COLLECTION: usize = 256 << 20;
/// One line of an `.ndjson` item collection: one item.
pub const MAX_LINE: usize = 16 << 20;
/// One item document of a static catalog. Items are kilobytes; a catalog
/// crawl reads several at once, so this also bounds what they hold together.
pub const MAX_ITEM: usize = 16 << 20;
/// How long one request may take. A page of 250 items takes Earth Search
/// one to five seconds; a server silent for this long is down.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// How many times a request that failed in a way that may pass (connection,
/// 5xx, 429) is tried in all.
const TRIES: u32 = 4;

/// A request to an HTTP server: what a search or a `next` link says to send.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// `GET` or `POST`.
    pub method: reqwest::Method,
    /// The URL, with its query for a GET.
    pub url: url::Url,
    /// Headers a `next` link asks for.
    pub headers: Map<String, Value>,
    /// The JSON body of a POST.
    pub body: Option<Map<String, Value>>,
}

impl Request {
    /// A GET of `url`.
    pub fn get(url: url::Url) -> Request {
        Request {
            method: reqwest::Method::GET,
            url,
            headers: Map::new(),
            body: None,
        }
    }
}

/// Reads STAC documents from HTTP servers and object stores.
#[derive(Clone)]
pub struct Fetcher {
    stores: StoreCache,
    http: reqwest::Client,
}

impl Fetcher {
    /// A fetcher over the job's stores.
    pub fn new(stores: &StoreCache) -> Result<Fetcher> {
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .user_agent(concat!("rsembed/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| Error::StacFetch {
                url: "(HTTP client)".into(),
                source: Box::new(e),
            })?;
        Ok(Fetcher {
            stores: stores.clone(),
            http,
        })
    }

    /// The whole document at `url` (http(s) or any store), at most `cap` bytes.
    pub async fn read(&self, url: &str, cap: usize) -> Result<Bytes> {
        if is_http(url) {
            let u = url::Url::parse(url).map_err(|e| Error::Stac {
                url: url.into(),
                reason: format!("not a URL: {e}"),
            })?;
            return self.send(&Request::get(u), cap).await;
        }
        let loc = self.stores.location(url)?;
        let got = loc
            .store
            .get(&loc.prefix)
            .await
            .map_err(|e| fetch_error(url, e))?;
        if got.meta.size > cap as u64 {
            return Err(too_large(url, cap));
        }
        let mut body = got.into_stream();
        let mut buf = BytesMut::new();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| fetch_error(url, e))?;
            push_capped(&mut buf, &chunk, cap, url)?;
        }
        Ok(buf.freeze())
    }

    /// The first `n` bytes of `url` (or a little more: whole chunks), and
    /// whether that is the whole document.
    pub async fn prefix(&self, url: &str, n: usize) -> Result<(Bytes, bool)> {
        let mut body = self.open(url).await?;
        let mut buf = BytesMut::new();
        while buf.len() < n {
            match body.next().await {
                Some(chunk) => buf.extend_from_slice(&chunk?),
                None => return Ok((buf.freeze(), true)),
            }
        }
        Ok((buf.freeze(), false))
    }

    /// The document at `url` when it starts like a JSON object or array, at
    /// most `cap` bytes; `None` (without reading further) when it does not.
    pub async fn json_document(&self, url: &str, cap: usize) -> Result<Option<Bytes>> {
        let mut body = self.open(url).await?;
        let mut buf = BytesMut::new();
        let mut checked = false;
        while let Some(chunk) = body.next().await {
            push_capped(&mut buf, &chunk?, cap, url)?;
            if !checked {
                match buf.iter().find(|b| !b.is_ascii_whitespace()) {
                    None => continue,
                    Some(b'{' | b'[') => checked = true,
                    Some(_) => return Ok(None),
                }
            }
        }
        Ok(checked.then(|| buf.freeze()))
    }

    /// The bytes of `url` on its store as a stream (for line-by-line reads).
    pub async fn open(&self, url: &str) -> Result<BoxStream<'static, Result<Bytes>>> {
        if is_http(url) {
            let u = url::Url::parse(url).map_err(|e| Error::Stac {
                url: url.into(),
                reason: format!("not a URL: {e}"),
            })?;
            let resp = self.response(&Request::get(u)).await?;
            let url = url.to_owned();
            return Ok(futures::stream::unfold(Some(resp), move |resp| {
                let url = url.clone();
                async move {
                    let mut resp = resp?;
                    match resp.chunk().await {
                        Ok(Some(b)) => Some((Ok(b), Some(resp))),
                        Ok(None) => None,
                        Err(e) => Some((Err(fetch_error(&url, e)), None)),
                    }
                }
            })
            .boxed());
        }
        let loc = self.stores.location(url)?;
        let got = loc
            .store
            .get(&loc.prefix)
            .await
            .map_err(|e| fetch_error(url, e))?;
        let url = url.to_owned();
        Ok(got
            .into_stream()
            .map(move |r| r.map_err(|e| fetch_error(&url, e)))
            .boxed())
    }

    /// The answer to `req`, at most `cap` bytes.
    pub async fn send(&self, req: &Request, cap: usize) -> Result<Bytes> {
        let mut resp = self.response(req).await?;
        let url = req.url.as_str();
        if resp.content_length().is_some_and(|n| n > cap as u64) {
            return Err(too_large(url, cap));
        }
        let mut buf = BytesMut::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| fetch_error(url, e))? {
            push_capped(&mut buf, &chunk, cap, url)?;
        }
        Ok(buf.freeze())
    }

    /// Sends `req`, trying again after failures that may pass; an answer
    /// with an error status is an error carrying the start of its body.
    async fn response(&self, req: &Request) -> Result<reqwest::Response> {
        let mut wait = Duration::from_millis(250);
        let mut tries = 0;
        loop {
            tries += 1;
            let result = self.send_once(req).await;
            let again = match &result {
                Err(e) => {
                    tries < TRIES && e.retry_hint() == rsembed_worker::retry::RetryHint::Later
                }
                Ok(_) => false,
            };
            if !again {
                return result;
            }
            tracing::warn!(url = %req.url, cause = %result.err().map(|e| e.to_string()).unwrap_or_default(), "STAC request failed; trying again");
            tokio::time::sleep(wait).await;
            wait *= 4;
        }
    }

    async fn send_once(&self, req: &Request) -> Result<reqwest::Response> {
        let url = req.url.as_str();
        let mut b = self
            .http
            .request(req.method.clone(), req.url.clone())
            .header(
                reqwest::header::ACCEPT,
                "application/geo+json, application/json",
            );
        for (k, v) in &req.headers {
            // A header value a link gives as a JSON string is sent as is; any
            // other JSON value as its JSON text (not quoted twice).
            let v = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            b = b.header(k.as_str(), v);
        }
        if let Some(body) = &req.body {
            b = b
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(serde_json::to_vec(body)?);
        }
        let resp = b.send().await.map_err(|e| fetch_error(url, e))?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        // The start of the body says what the server did not like; more is noise.
        let mut resp = resp;
        let mut body = Vec::new();
        while let Ok(Some(chunk)) = resp.chunk().await {
            body.extend_from_slice(&chunk[..chunk.len().min(600 - body.len())]);
            if body.len() >= 600 {
                break;
            }
        }
        Err(Error::StacStatus {
            url: url.into(),
            status: status.as_u16(),
            body: String::from_utf8_lossy(&body).trim().to_owned(),
        })
    }
}

/// Whether `url` is read over HTTP(S).
pub fn is_http(url: &str) -> bool {
    let l = url.get(..8).unwrap_or(url).to_ascii_lowercase();
    l.starts_with("http://") || l.starts_with("https://")
}

/// Appends `chunk`, or fails once the total would pass `cap`.
pub(crate) fn push_capped(buf: &mut BytesMut, chunk: &[u8], cap: usize, url: &str) -> Result<()> {
    if buf.len() + chunk.len() > cap {
        return Err(too_large(url, cap));
    }
    buf.extend_from_slice(chunk);
    Ok(())
}

/// The error of a document over its cap.
pub(crate) fn too_large(url: &str, cap: usize) -> Error {
    let hint = if cap == MAX_ITEM_COLLECTION {
        "; write large item collections as .ndjson or stac-geoparquet, which are streamed"
    } else {
        ""
    };
    Error::Stac {
        url: url.into(),
        reason: format!("exceeds {} MiB{hint}", cap >> 20),
    }
}

fn fetch_error(url: &str, e: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::StacFetch {
        url: url.into(),
        source: Box::new(e),
    }
}

/// Splits a byte stream into lines of at most `cap` bytes each (without the
/// line end), so one line, not the whole file, is what memory holds.
pub struct Lines {
    inner: BoxStream<'static, Result<Bytes>>,
    buf: BytesMut,
    /// How much of `buf` holds no line end.
    scanned: usize,
    cap: usize,
    url: String,
    done: bool,
    /// 1-based number of the last line returned.
    pub number: u64,
}

impl Lines {
    /// Lines of `inner`, which was read from `url`.
    pub fn new(inner: BoxStream<'static, Result<Bytes>>, url: &str, cap: usize) -> Lines {
        Lines {
            inner,
            buf: BytesMut::new(),
            scanned: 0,
            cap,
            url: url.into(),
            done: false,
            number: 0,
        }
    }

    /// The next line; `None` at the end.
    pub async fn next_line(&mut self) -> Result<Option<Bytes>> {
        loop {
            // Only the bytes not searched yet: a long line arrives in many
            // chunks, and searching it whole each time is quadratic.
            let from = self.scanned.min(self.buf.len());
            if let Some(i) = self.buf[from..].iter().position(|&b| b == b'\n') {
                let i = from + i;
                self.scanned = 0;
                let mut line = self.buf.split_to(i + 1);
                line.truncate(i);
                if line.last() == Some(&b'\r') {
                    line.truncate(i - 1);
                }
                self.number += 1;
                return Ok(Some(line.freeze()));
            }
            if self.buf.len() > self.cap {
                return Err(Error::Stac {
                    url: self.url.clone(),
                    reason: format!("line {} exceeds {} MiB", self.number + 1, self.cap >> 20),
                });
            }
            if self.done {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                self.number += 1;
                return Ok(Some(self.buf.split().freeze()));
            }
            self.scanned = self.buf.len();
            match self.inner.next().await {
                Some(chunk) => self.buf.extend_from_slice(&chunk?),
                None => self.done = true,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines_of(chunks: &[&'static [u8]], cap: usize) -> Lines {
        let s = futures::stream::iter(
            chunks
                .iter()
                .map(|c| Ok(Bytes::from_static(c)))
                .collect::<Vec<_>>(),
        );
        Lines::new(s.boxed(), "mem://x.ndjson", cap)
    }

    #[tokio::test]
    async fn lines_split_across_chunks_and_strip_line_ends() {
        let mut l = lines_of(&[b"{\"a\":1}\r\n{\"b\"", b":2}\n\n", b"{\"c\":3}"], 100);
        let mut got = vec![];
        while let Some(line) = l.next_line().await.unwrap() {
            got.push(String::from_utf8(line.to_vec()).unwrap());
        }
        assert_eq!(got, ["{\"a\":1}", "{\"b\":2}", "", "{\"c\":3}"]);
        assert_eq!(l.number, 4);
    }

    #[tokio::test]
    async fn a_line_over_the_cap_is_an_error() {
        let mut l = lines_of(&[b"short\n", b"0123456789", b"0123456789", b"\n"], 12);
        assert_eq!(&l.next_line().await.unwrap().unwrap()[..], b"short");
        let e = l.next_line().await.unwrap_err().to_string();
        assert!(e.contains("line 2 exceeds"), "{e}");
    }

    #[test]
    fn caps_stop_the_read() {
        let mut b = BytesMut::new();
        push_capped(&mut b, b"12345", 8, "u").unwrap();
        let e = push_capped(&mut b, b"6789", 8, "u")
            .unwrap_err()
            .to_string();
        assert!(e.contains("exceeds"), "{e}");
        let e = too_large("x.json", MAX_ITEM_COLLECTION).to_string();
        assert!(e.contains("ndjson"), "{e}");
    }
}
