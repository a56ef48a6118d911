//! A real Azure Blob Storage API for the tests: Azurite's blob service
//! (npm `azurite`, installed into `.cache/npm` by `scripts/setup-test-env.sh`)
//! on a free loopback port, one process per [`AzuriteServer`], killed on drop.
//!
//! Containers and blobs are made and read back with the Azure SDK for Python
//! (`azure-storage-blob`, in `integration-tests/requirements.txt`),
//! independently of rsembed's own `object_store` client.

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{python, root};

/// How long Azurite may take to listen after it starts, on a busy machine.
const STARTUP: Duration = Duration::from_secs(60);

/// Azurite's well-known development account.
pub const ACCOUNT: &str = "devstoreaccount1";
/// Azurite's well-known development account key (public, documented by Microsoft).
pub const ACCOUNT_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// Blob operations for [`AzuriteServer`]'s helpers:
/// `python -c OPS <connection string> <op> <args>...`.
const OPS: &str = r#"
import json, os, sys
from azure.storage.blob import BlobServiceClient

conn, op, *args = sys.argv[1:]
svc = BlobServiceClient.from_connection_string(conn)

def split(url):
    assert url.startswith("az://"), url
    container, _, k = url[5:].partition("/")
    return container, k.strip("/")

def blobs(url):
    container, prefix = split(url)
    p = prefix + "/" if prefix else ""
    for b in svc.get_container_client(container).list_blobs(name_starts_with=p):
        yield container, b.name, b.name[len(p):], b.size

if op == "mb":
    svc.create_container(args[0])
elif op == "put":
    src, url = args
    container, k = split(url)
    cc = svc.get_container_client(container)
    files = []
    if os.path.isdir(src):
        for root, _, names in os.walk(src):
            for f in sorted(names):
                path = os.path.join(root, f)
                rel = os.path.relpath(path, src).replace(os.sep, "/")
                files.append((path, f"{k}/{rel}" if k else rel))
    else:
        files.append((src, k))
    for path, name in files:
        with open(path, "rb") as f:
            cc.upload_blob(name, f, overwrite=True)
elif op == "ls":
    print(json.dumps([[rel, size] for _, _, rel, size in blobs(args[0])]))
elif op == "get":
    url, dst = args
    for container, name, rel, _ in blobs(url):
        path = os.path.join(dst, *rel.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(svc.get_blob_client(container, name).download_blob().readall())
else:
    sys.exit(f"unknown op {op}")
"#;

/// The `azurite-blob` launcher: `RSEMBED_TEST_AZURITE`, or `.cache/npm`.
pub fn azurite_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("RSEMBED_TEST_AZURITE").filter(|v| !v.is_empty()) {
        return PathBuf::from(p);
    }
    root().join(".cache/npm/node_modules/.bin/azurite-blob")
}

/// A running Azurite blob service. Dropping it kills the process.
pub struct AzuriteServer {
    child: Child,
    port: u16,
    log: tempfile::NamedTempFile,
    _data: tempfile::TempDir,
}

impl AzuriteServer {
    /// Starts a server with an empty account.
    pub fn start() -> AzuriteServer {
        let bin = azurite_bin();
        assert!(
            bin.is_file(),
            "Azurite missing at {}: run scripts/setup-test-env.sh (npm install azurite into \
             .cache/npm), or set RSEMBED_TEST_AZURITE to an azurite-blob launcher",
            bin.display()
        );
        // A free port can be taken between our probe and Azurite's bind: try again.
        let mut last = String::new();
        for _ in 0..3 {
            match Self::try_start(&bin) {
                Ok(s) => return s,
                Err(e) if e.contains("EADDRINUSE") => last = e,
                Err(e) => panic!("{e}"),
            }
        }
        panic!("{last}")
    }

    fn try_start(bin: &Path) -> Result<AzuriteServer, String> {
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .expect("a free loopback port")
            .port();
        let log = tempfile::NamedTempFile::new().expect("a temporary log file");
        let data = tempfile::tempdir().expect("a temporary data folder");
        let mut cmd = Command::new(bin);
        // --skipApiVersionCheck: the SDKs (object_store's and Python's) may speak
        // a newer service version than this Azurite knows.
        cmd.args([
            "--skipApiVersionCheck",
            "--disableTelemetry",
            "--silent",
            "--blobHost",
            "127.0.0.1",
            "--blobPort",
        ])
        .arg(port.to_string())
        .arg("--location")
        .arg(data.path())
        .stdin(Stdio::null())
        .stdout(Stdio::from(log.reopen().expect("log file reopens")))
        .stderr(Stdio::from(log.reopen().expect("log file reopens")));
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start Azurite ({}): {e}", bin.display()))?;
        let mut server = AzuriteServer {
            child,
            port,
            log,
            _data: data,
        };
        let started = Instant::now();
        loop {
            if let Some(status) = server.child.try_wait().expect("wait on Azurite") {
                return Err(format!(
                    "Azurite exited with {status} before listening on port {port}\n{}",
                    server.log()
                ));
            }
            if TcpStream::connect_timeout(
                &(Ipv4Addr::LOCALHOST, port).into(),
                Duration::from_millis(200),
            )
            .is_ok()
            {
                return Ok(server);
            }
            if started.elapsed() > STARTUP {
                return Err(format!(
                    "Azurite did not listen on port {port} within {STARTUP:?}\n{}",
                    server.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// What the server has printed.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    /// `http://127.0.0.1:<port>`: the service root (the account is the first
    /// path segment, as Azurite serves it).
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The connection string of the development account on this server.
    pub fn connection_string(&self) -> String {
        format!(
            "DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};\
             BlobEndpoint={}/{ACCOUNT};",
            self.endpoint()
        )
    }

    /// The environment rsembed (object_store's `MicrosoftAzureBuilder::from_env`)
    /// needs to reach this server: emulator mode, its URL, the account and key.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AZURE_STORAGE_USE_EMULATOR", "true".into()),
            ("AZURITE_BLOB_STORAGE_URL", self.endpoint()),
            ("AZURE_STORAGE_ACCOUNT_NAME", ACCOUNT.into()),
            ("AZURE_STORAGE_ACCOUNT_KEY", ACCOUNT_KEY.into()),
        ]
    }

    /// Points a command at this server: drops every inherited `AZURE_*` and
    /// `AZURITE_*` variable (a developer's real account would otherwise mix
    /// in) and sets [`AzuriteServer::env`].
    pub fn configure<'a>(&self, cmd: &'a mut Command) -> &'a mut Command {
        clear_azure_env(cmd);
        cmd.envs(self.env())
    }

    fn ops(&self, args: &[&str]) -> Vec<u8> {
        let mut cmd = Command::new(python());
        cmd.args(["-c", OPS])
            .arg(self.connection_string())
            .args(args);
        clear_azure_env(&mut cmd);
        let out = cmd.output().expect("python starts");
        assert!(
            out.status.success(),
            "Azure helper {args:?} failed (is azure-storage-blob installed in the test \
             Python? scripts/setup-test-env.sh):\n{}\nserver log:\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        out.stdout
    }

    /// Creates a container.
    pub fn create_container(&self, name: &str) {
        self.ops(&["mb", name]);
    }

    /// Uploads a local file to the blob `url` (`az://container/name`), or a
    /// local folder to the blobs under the prefix `url`.
    pub fn upload(&self, local: &Path, url: &str) {
        let src = local.to_str().expect("test paths are UTF-8");
        self.ops(&["put", src, url]);
    }

    /// The blobs under the prefix `url`: name relative to the prefix, and size.
    pub fn list(&self, url: &str) -> Vec<(String, u64)> {
        serde_json::from_slice(&self.ops(&["ls", url])).expect("ls prints JSON")
    }

    /// Downloads every blob under the prefix `url` into the folder `dir`.
    pub fn download(&self, url: &str, dir: &Path) {
        let dst = dir.to_str().expect("test paths are UTF-8");
        self.ops(&["get", url, dst]);
    }
}

impl Drop for AzuriteServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn clear_azure_env(cmd: &mut Command) {
    for (k, _) in std::env::vars_os() {
        if let Some(k) = k.to_str() {
            if k.starts_with("AZURE_") || k.starts_with("AZURITE_") {
                cmd.env_remove(k);
            }
        }
    }
}
