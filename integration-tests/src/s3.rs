//! A real S3-API server for the tests: moto's standalone server
//! (`python -m moto.server`, from `integration-tests/requirements.txt`) on a
//! free loopback port, one process per [`S3Server`], killed on drop.
//!
//! Buckets and objects are made and read back with boto3 through the test
//! Python, independently of rsembed's own `object_store` client.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::python;

/// How long the server may take to answer after it starts: moto imports a lot,
/// and a busy two-core machine building the workspace is slow.
const STARTUP: Duration = Duration::from_secs(60);

/// The region the tests sign for.
pub const REGION: &str = "us-east-1";

/// S3 operations for [`S3Server`]'s helpers:
/// `python -c OPS <endpoint> <key> <secret> <op> <args>...`.
const OPS: &str = r#"
import json, os, sys, urllib.request
import boto3
from botocore.config import Config

endpoint, key, secret, op, *args = sys.argv[1:]
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                  aws_access_key_id=key, aws_secret_access_key=secret,
                  config=Config(s3={"addressing_style": "path"}))

def split(url):
    assert url.startswith("s3://"), url
    bucket, _, k = url[5:].partition("/")
    return bucket, k.strip("/")

def keys(url):
    bucket, prefix = split(url)
    p = prefix + "/" if prefix else ""
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=p):
        for o in page.get("Contents", []):
            yield bucket, o["Key"], o["Key"][len(p):], o["Size"]

if op == "mb":
    s3.create_bucket(Bucket=args[0])
elif op == "put":
    src, url = args
    bucket, k = split(url)
    if os.path.isdir(src):
        for root, _, files in os.walk(src):
            for f in sorted(files):
                path = os.path.join(root, f)
                rel = os.path.relpath(path, src).replace(os.sep, "/")
                s3.upload_file(path, bucket, f"{k}/{rel}" if k else rel)
    else:
        s3.upload_file(src, bucket, k)
elif op == "marker":
    bucket, k = split(args[0])
    s3.put_object(Bucket=bucket, Key=k + "/", Body=b"")
elif op == "ls":
    print(json.dumps([[rel, size] for _, _, rel, size in keys(args[0])]))
elif op == "get":
    url, dst = args
    for bucket, k, rel, _ in keys(url):
        path = os.path.join(dst, *rel.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        s3.download_file(bucket, k, path)
elif op == "public":
    # Anonymous GET and HEAD (with Range) at http://host/bucket/key.
    for bucket, k, _, _ in keys(args[0]):
        s3.put_object_acl(Bucket=bucket, Key=k, ACL="public-read")
elif op == "rm":
    bucket, k = split(args[0])
    s3.delete_object(Bucket=bucket, Key=k)
elif op == "iam-user":
    # A user allowed everything on S3; then every request must be signed by it.
    iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1",
                       aws_access_key_id=key, aws_secret_access_key=secret)
    iam.create_user(UserName="rsembed-test")
    iam.put_user_policy(UserName="rsembed-test", PolicyName="s3", PolicyDocument=json.dumps(
        {"Version": "2012-10-17",
         "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
    k = iam.create_access_key(UserName="rsembed-test")["AccessKey"]
    req = urllib.request.Request(endpoint + "/moto-api/reset-auth", data=b"0",
                                 headers={"Content-Type": "text/plain"}, method="POST")
    urllib.request.urlopen(req).read()
    print(json.dumps([k["AccessKeyId"], k["SecretAccessKey"]]))
else:
    sys.exit(f"unknown op {op}")
"#;

/// A running moto S3 server. Dropping it kills the process.
pub struct S3Server {
    child: Child,
    port: u16,
    log: tempfile::NamedTempFile,
    access_key: String,
    secret_key: String,
}

impl S3Server {
    /// Starts a server that accepts any credentials.
    pub fn start() -> S3Server {
        // A free port can be taken between our probe and moto's bind: try again.
        let mut last = String::new();
        for _ in 0..3 {
            match Self::try_start() {
                Ok(s) => return s,
                Err(e) if e.contains("Address already in use") => last = e,
                Err(e) => panic!("{e}"),
            }
        }
        panic!("{last}")
    }

    /// Starts a server that checks signatures: only the key pair of an IAM user
    /// it makes (the one [`S3Server::env`] gives) is accepted.
    pub fn start_with_auth() -> S3Server {
        let mut s = Self::start();
        let out = s.ops(&["iam-user"]);
        let [key, secret]: [String; 2] =
            serde_json::from_slice(&out).expect("iam-user prints a key pair");
        s.access_key = key;
        s.secret_key = secret;
        s
    }

    fn try_start() -> Result<S3Server, String> {
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .expect("a free loopback port")
            .port();
        let log = tempfile::NamedTempFile::new().expect("a temporary log file");
        let mut cmd = Command::new(python());
        cmd.args(["-m", "moto.server", "-H", "127.0.0.1", "-p"])
            .arg(port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.reopen().expect("log file reopens")))
            .stderr(Stdio::from(log.reopen().expect("log file reopens")));
        clear_aws_env(&mut cmd);
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start moto ({}): {e}", python().display()))?;
        let mut server = S3Server {
            child,
            port,
            log,
            access_key: "rsembed-test-key".into(),
            secret_key: "rsembed-test-secret".into(),
        };
        let started = Instant::now();
        loop {
            if let Some(status) = server.child.try_wait().expect("wait on moto") {
                return Err(format!(
                    "moto server exited with {status} before answering on port {port}; \
                     is moto installed in the test Python (scripts/setup-test-env.sh)?\n{}",
                    server.log()
                ));
            }
            if answers(port) {
                return Ok(server);
            }
            if started.elapsed() > STARTUP {
                return Err(format!(
                    "moto server did not answer on port {port} within {STARTUP:?}\n{}",
                    server.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// What the server has printed (its request log and any traceback).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The environment rsembed (object_store's `AmazonS3Builder::from_env`) needs
    /// to reach this server: endpoint, plain HTTP, path-style requests, keys and
    /// region.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT", self.endpoint()),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "false".into()),
            ("AWS_ACCESS_KEY_ID", self.access_key.clone()),
            ("AWS_SECRET_ACCESS_KEY", self.secret_key.clone()),
            ("AWS_REGION", REGION.into()),
        ]
    }

    /// Points a command at this server: drops every inherited `AWS_*` variable
    /// (a developer's `AWS_ENDPOINT_URL`, `AWS_SESSION_TOKEN` or `AWS_PROFILE`
    /// would otherwise mix in) and sets [`S3Server::env`].
    pub fn configure<'a>(&self, cmd: &'a mut Command) -> &'a mut Command {
        clear_aws_env(cmd);
        cmd.envs(self.env())
    }

    fn ops(&self, args: &[&str]) -> Vec<u8> {
        let mut cmd = Command::new(python());
        cmd.args(["-c", OPS])
            .arg(self.endpoint())
            .arg(&self.access_key)
            .arg(&self.secret_key)
            .args(args);
        clear_aws_env(&mut cmd);
        let out = cmd.output().expect("python starts");
        assert!(
            out.status.success(),
            "S3 helper {args:?} failed:\n{}\nserver log:\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        out.stdout
    }

    /// Creates a bucket.
    pub fn create_bucket(&self, name: &str) {
        self.ops(&["mb", name]);
    }

    /// Uploads a local file to the object `url` (`s3://bucket/key`), or a local
    /// folder to the objects under the prefix `url`.
    pub fn upload(&self, local: &Path, url: &str) {
        let src = local.to_str().expect("test paths are UTF-8");
        self.ops(&["put", src, url]);
    }

    /// Puts the empty `<key>/` object that consoles create for a "folder" `url`.
    pub fn put_folder_marker(&self, url: &str) {
        self.ops(&["marker", url]);
    }

    /// The objects under the prefix `url`: key relative to the prefix, and size.
    pub fn list(&self, url: &str) -> Vec<(String, u64)> {
        serde_json::from_slice(&self.ops(&["ls", url])).expect("ls prints JSON")
    }

    /// Downloads every object under the prefix `url` into the folder `dir`.
    pub fn download(&self, url: &str, dir: &Path) {
        let dst = dir.to_str().expect("test paths are UTF-8");
        self.ops(&["get", url, dst]);
    }

    /// Makes every object under the prefix `url` readable without credentials,
    /// so that plain HTTP clients can GET it at [`S3Server::http_url`].
    pub fn make_public(&self, url: &str) {
        self.ops(&["public", url]);
    }

    /// The path-style plain-HTTP URL of the object `url` (`s3://bucket/key`).
    pub fn http_url(&self, url: &str) -> String {
        let rest = url.strip_prefix("s3://").expect("an s3:// URL");
        format!("{}/{rest}", self.endpoint())
    }

    /// Deletes the object `url`.
    pub fn delete(&self, url: &str) {
        self.ops(&["rm", url]);
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether an HTTP server answers on the port.
fn answers(port: u16) -> bool {
    let addr = (Ipv4Addr::LOCALHOST, port).into();
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    if s.write_all(b"GET / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.")
}

fn clear_aws_env(cmd: &mut Command) {
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("AWS_") {
            cmd.env_remove(k);
        }
    }
}
