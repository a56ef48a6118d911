//! STAC for the tests: a real STAC API (`rustac serve`, the in-memory
//! server of the rustac project, from the test Python's `rustac` package),
//! a small scripted HTTP server for what no real server does on purpose
//! (endless pages, `next` links that loop, a server that conforms to filter),
//! and generated items of STAC 1.0 and 1.1.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::{free_port, http_get, python};

/// How long `rustac serve` may take to answer: it loads every item first.
const STARTUP: Duration = Duration::from_secs(60);

/// The `rustac` CLI next to the test Python.
pub fn rustac_bin() -> PathBuf {
    python().with_file_name("rustac")
}

/// `rustac serve` on a free loopback port, killed on drop.
pub struct StacServer {
    child: Child,
    port: u16,
    log: tempfile::NamedTempFile,
}

impl StacServer {
    /// Serves `files` (collections, items, item collections: whatever
    /// `rustac serve` loads).
    pub fn start(files: &[&Path]) -> StacServer {
        let mut last = String::new();
        for _ in 0..3 {
            match Self::try_start(files) {
                Ok(s) => return s,
                Err(e) if e.contains("in use") => last = e,
                Err(e) => panic!("{e}"),
            }
        }
        panic!("{last}")
    }

    fn try_start(files: &[&Path]) -> Result<StacServer, String> {
        let port = free_port();
        let log = tempfile::NamedTempFile::new().expect("a temporary log file");
        let child = Command::new(rustac_bin())
            .arg("serve")
            .args(files)
            .args(["--addr", &format!("127.0.0.1:{port}")])
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.reopen().expect("log file reopens")))
            .stderr(Stdio::from(log.reopen().expect("log file reopens")))
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", rustac_bin().display()))?;
        let mut s = StacServer { child, port, log };
        let started = Instant::now();
        loop {
            if let Some(status) = s.child.try_wait().expect("wait on rustac") {
                return Err(format!(
                    "rustac serve exited with {status} before answering:\n{}",
                    s.log()
                ));
            }
            if http_get(port, "/").is_some_and(|(status, _)| status.contains(" 200")) {
                return Ok(s);
            }
            if started.elapsed() > STARTUP {
                return Err(format!(
                    "rustac serve did not answer within {STARTUP:?}:\n{}",
                    s.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `http://127.0.0.1:<port>/`, the landing page.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// What the server printed.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }
}

impl Drop for StacServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One request the scripted server received.
#[derive(Debug, Clone)]
pub struct Request {
    /// `GET`, `POST`, ...
    pub method: String,
    /// Path and query.
    pub target: String,
    /// Header names in lower case, and values.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Request {
    /// The body as JSON (`Null` when it is not).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// What the scripted server answers.
pub enum Reply {
    /// A status and a JSON body.
    Json(u16, Value),
    /// A status, a content type and bytes.
    Bytes(u16, &'static str, Vec<u8>),
    /// `200` with a JSON-looking body that never ends (`{"features":[` then
    /// the same chunk again and again), until the client hangs up.
    Endless,
}

type Handler = dyn Fn(&Request) -> Reply + Send + Sync;

/// An HTTP/1.1 server on a free loopback port whose answers a closure
/// decides; it records every request. One connection per request.
pub struct ScriptServer {
    port: u16,
    stop: Arc<AtomicBool>,
    requests: Arc<Mutex<Vec<Request>>>,
}

impl ScriptServer {
    /// Starts serving with `handler`.
    pub fn start(handler: impl Fn(&Request) -> Reply + Send + Sync + 'static) -> ScriptServer {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("a free port");
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let requests: Arc<Mutex<Vec<Request>>> = Arc::default();
        let handler: Arc<Handler> = Arc::new(handler);
        let (stop2, requests2) = (stop.clone(), requests.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let (handler, requests) = (handler.clone(), requests2.clone());
                std::thread::spawn(move || serve(conn, &*handler, &requests));
            }
        });
        ScriptServer {
            port,
            stop,
            requests,
        }
    }

    /// `http://127.0.0.1:<port>` (no trailing slash).
    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The requests so far.
    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }
}

impl Drop for ScriptServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port));
    }
}

fn serve(conn: TcpStream, handler: &Handler, requests: &Mutex<Vec<Request>>) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
    let mut r = BufReader::new(conn.try_clone().expect("socket clones"));
    let mut line = String::new();
    if r.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let mut parts = line.split_whitespace();
    let (method, target) = (
        parts.next().unwrap_or("").to_owned(),
        parts.next().unwrap_or("").to_owned(),
    );
    let mut headers = vec![];
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
        }
    }
    let len: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len.min(16 << 20)];
    let _ = r.read_exact(&mut body);
    let req = Request {
        method,
        target,
        headers,
        body,
    };
    requests.lock().unwrap().push(req.clone());
    let mut w = conn;
    let head = |status: u16, ctype: &str, len: Option<usize>| {
        let len = len.map_or(String::new(), |n| format!("Content-Length: {n}\r\n"));
        format!("HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\n{len}Connection: close\r\n\r\n")
    };
    match handler(&req) {
        Reply::Json(status, v) => {
            let b = serde_json::to_vec(&v).unwrap();
            let _ = w.write_all(head(status, "application/json", Some(b.len())).as_bytes());
            let _ = w.write_all(&b);
        }
        Reply::Bytes(status, ctype, b) => {
            let _ = w.write_all(head(status, ctype, Some(b.len())).as_bytes());
            let _ = w.write_all(&b);
        }
        Reply::Endless => {
            let _ = w.write_all(head(200, "application/geo+json", None).as_bytes());
            let _ = w.write_all(b"{\"type\":\"FeatureCollection\",\"features\":[");
            let chunk = format!("{},", item(0, "1.1.0", "c1")).repeat(64);
            // Until the client hangs up; a bound so a broken client cannot
            // keep the test busy for ever (64 GiB).
            for _ in 0..(64u64 << 30) / chunk.len() as u64 {
                if w.write_all(chunk.as_bytes()).is_err() {
                    break;
                }
            }
        }
    }
    let _ = w.flush();
}

/// A landing page whose search links point at `search` (methods given).
pub fn landing_page(root: &str, search: &str, methods: &[&str], conforms_to: &[&str]) -> Value {
    let mut links = vec![
        json!({"rel": "self", "href": root}),
        json!({"rel": "root", "href": root}),
    ];
    for m in methods {
        links.push(
            json!({"rel": "search", "href": search, "method": m, "type": "application/geo+json"}),
        );
    }
    json!({"type": "Catalog", "id": "test-api", "description": "scripted", "stac_version": "1.0.0",
        "links": links, "conformsTo": conforms_to})
}

/// The conformance classes of an item-search server (no extensions).
pub const ITEM_SEARCH: &[&str] = &[
    "https://api.stacspec.org/v1.0.0/core",
    "https://api.stacspec.org/v1.0.0/item-search",
];

/// Item `i` of a generated archive: a 1°×1° footprint at longitude
/// `i % 50 - 25`, latitude `i / 50 % 40 - 20`; datetime 2024-01-01 plus `i`
/// days (`i` mod 366); `eo:cloud_cover` = `i % 101`. STAC 1.0 items carry
/// `eo:bands` on their assets, 1.1 items `bands`.
pub fn item(i: usize, version: &str, collection: &str) -> Value {
    let (x, y) = ((i % 50) as f64 - 25.0, ((i / 50) % 40) as f64 - 20.0);
    let day = time_of(i);
    let band = |cn: &str| {
        if version == "1.0.0" {
            json!({"eo:bands": [{"name": cn, "common_name": cn}]})
        } else {
            json!({"bands": [{"name": cn, "eo:common_name": cn}]})
        }
    };
    let mut assets = serde_json::Map::new();
    for cn in ["red", "green", "blue"] {
        let mut a =
            json!({"href": format!("./{cn}.tif"), "type": "image/tiff; application=geotiff"});
        for (k, v) in band(cn).as_object().unwrap() {
            a[k] = v.clone();
        }
        assets.insert(cn.into(), a);
    }
    json!({
        "type": "Feature",
        "stac_version": version,
        "id": item_id(i),
        "collection": collection,
        "geometry": {"type": "Polygon", "coordinates": [[[x, y], [x + 1.0, y], [x + 1.0, y + 1.0], [x, y + 1.0], [x, y]]]},
        "bbox": [x, y, x + 1.0, y + 1.0],
        "properties": {"datetime": day, "eo:cloud_cover": i % 101, "platform": if i.is_multiple_of(2) { "sentinel-2a" } else { "sentinel-2b" }},
        "links": [],
        "assets": assets,
    })
}

/// The id of item `i`.
pub fn item_id(i: usize) -> String {
    format!("item-{i:05}")
}

/// Item `i`'s datetime.
pub fn time_of(i: usize) -> String {
    // 2024 is a leap year.
    const DAYS: [usize; 12] = [31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    let mut day = i % 366;
    let mut month = 0;
    while day >= DAYS[month] {
        day -= DAYS[month];
        month += 1;
    }
    format!("2024-{:02}-{:02}T10:00:00Z", month + 1, day + 1)
}

/// A collection document for `rustac serve` or a static catalog.
pub fn collection(id: &str) -> Value {
    json!({"type": "Collection", "stac_version": "1.1.0", "id": id, "description": id,
        "license": "CC-BY-4.0", "links": [],
        "extent": {"spatial": {"bbox": [[-180.0, -90.0, 180.0, 90.0]]},
                   "temporal": {"interval": [["2024-01-01T00:00:00Z", null]]}}})
}

/// Writes items as a FeatureCollection.
pub fn write_feature_collection(path: &Path, items: &[Value]) {
    let fc = json!({"type": "FeatureCollection", "features": items});
    std::fs::write(path, serde_json::to_vec(&fc).unwrap()).unwrap();
}

/// Writes items one per line.
pub fn write_ndjson(path: &Path, items: &[Value]) {
    let mut s = String::new();
    for i in items {
        s.push_str(&i.to_string());
        s.push('\n');
    }
    std::fs::write(path, s).unwrap();
}

/// Translates an item collection to stac-geoparquet with `rustac translate`.
pub fn write_geoparquet(from: &Path, to: &Path) {
    let out = Command::new(rustac_bin())
        .arg("translate")
        .arg(from)
        .arg(to)
        .output()
        .expect("rustac runs");
    assert!(
        out.status.success(),
        "rustac translate failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
