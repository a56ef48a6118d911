//! Every way `--nats` authenticates, against real nats-server processes
//! started from config files: TLS with client certificates (from a CA made
//! per run with rcgen), user and password, token and NKey. For each,
//! `rsembed submit`, `rsembed-worker`, `rsembed status` and `rsembed finalize`
//! all connect and run a two-image job; a wrong credential or certificate is
//! exit 1 at start naming the server and the cause; a worker whose user is
//! removed says so in `/readyz`; and no secret appears in any process's
//! output, with debug logs on.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use rsembed_integration_tests::cluster::{chip_counts, make_images, Worker};
use rsembed_integration_tests::nats::NatsServer;
use rsembed_integration_tests::{
    binary, free_port, http_get, rsembed, run, run_timeout, tiny_model,
};

const FINISH: Duration = Duration::from_secs(120);
/// A refused connection must fail at once, not retry: far less than this.
const REFUSED: Duration = Duration::from_secs(30);

/// How every command of one test reaches the server.
#[derive(Clone)]
struct Auth {
    url: String,
    /// Flags given to every command.
    args: Vec<String>,
    /// Environment given to every command.
    env: Vec<(String, String)>,
    /// Strings that must never be printed.
    secrets: Vec<String>,
}

impl Auth {
    fn new(url: &str) -> Auth {
        Auth {
            url: url.into(),
            args: Vec::new(),
            env: Vec::new(),
            secrets: Vec::new(),
        }
    }

    fn arg(mut self, flag: &str, value: impl AsRef<Path>) -> Auth {
        self.args.push(flag.into());
        self.args
            .push(value.as_ref().to_string_lossy().into_owned());
        self
    }

    fn env(mut self, key: &str, value: &str) -> Auth {
        self.env.push((key.into(), value.into()));
        self
    }

    fn secret(mut self, s: &str) -> Auth {
        self.secrets.push(s.into());
        self
    }

    /// `rsembed <sub> --nats <url> <auth>` with debug logs.
    fn rsembed(&self, sub: &str) -> Command {
        let mut c = rsembed();
        c.arg(sub)
            .arg("--nats")
            .arg(&self.url)
            .args(&self.args)
            .env("RSEMBED_LOG", "debug")
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        c
    }

    /// An `rsembed-worker` with these credentials and debug logs.
    fn worker(&self, name: &str, extra: &[&str]) -> Worker {
        let mut args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        args.extend_from_slice(extra);
        let mut env = vec![("RSEMBED_LOG", "debug,ort=warn".to_owned())];
        env.extend(self.env.iter().map(|(k, v)| (k.as_str(), v.clone())));
        Worker::start(&self.url, name, &args, &env)
    }
}

/// Everything the processes of one test printed.
#[derive(Default)]
struct Transcript(Vec<(String, String)>);

impl Transcript {
    fn add(&mut self, what: &str, out: &Output) {
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        self.0.push((what.into(), text));
    }

    fn add_text(&mut self, what: &str, text: String) {
        self.0.push((what.into(), text));
    }

    /// Panics when a secret appears anywhere, naming where.
    fn assert_no_secrets(&self, secrets: &[String]) {
        assert!(!secrets.is_empty(), "a test of secrets names them");
        for (what, text) in &self.0 {
            assert!(
                !text.is_empty(),
                "{what} printed nothing: the check would be empty"
            );
            assert!(!text.contains("panicked"), "{what} panicked:\n{text}");
            for s in secrets {
                assert!(
                    !text.contains(s.as_str()),
                    "{what} printed the secret `{s}`:\n{text}"
                );
            }
        }
    }
}

/// Submits two images, runs one worker until it has taken both tasks, and
/// checks `status` and `finalize`: every command connects with `auth`.
fn job_with_every_command(auth: &Auth, log: &mut Transcript) {
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    make_images(&input, 2);

    let out = run(auth
        .rsembed("submit")
        .arg("--input")
        .arg(&input)
        .arg("--output")
        .arg(&output)
        .arg("--model")
        .arg(tiny_model())
        .args(["--task-size", "1", "--json"]));
    assert_eq!(out.status.code(), Some(0), "submit");
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).expect("submit --json");
    assert_eq!(s["published"], 2, "{s}");
    log.add("submit", &out);

    let mut w = auth.worker("w", &["--max-tasks", "2"]);
    let st = w.wait(FINISH);
    assert!(st.success(), "worker: {st:?}\n{}", w.log());
    assert!(w.log().contains("task done"), "{}", w.log());
    log.add_text("rsembed-worker", w.log());

    let started = Instant::now();
    let status = loop {
        let out = run(auth
            .rsembed("status")
            .arg("--output")
            .arg(&output)
            .arg("--json"));
        assert_eq!(out.status.code(), Some(0), "status");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status --json");
        if v["finished"] == true {
            log.add("status", &out);
            break v;
        }
        assert!(started.elapsed() < FINISH, "job not finished: {v}");
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(
        (status["done"].as_u64(), status["failed"].as_u64()),
        (Some(2), Some(0))
    );

    let out = run(auth
        .rsembed("finalize")
        .arg("--output")
        .arg(&output)
        .arg("--json"));
    assert_eq!(out.status.code(), Some(0), "finalize");
    log.add("finalize", &out);
    assert_eq!(chip_counts(&output), (2, 2, 2), "every chip exactly once");
}

/// `rsembed status` and `rsembed-worker` with `auth` both exit 1 at once,
/// naming the server and `cause`, and printing none of `secrets`.
fn refused(auth: &Auth, cause: &str, log: &mut Transcript) {
    let dir = tempfile::tempdir().unwrap();
    let out = run_timeout(
        auth.rsembed("status").arg("--output").arg(dir.path()),
        REFUSED,
    );
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "status exits 1:\n{stderr}");
    assert!(
        stderr.contains(cause),
        "names the cause `{cause}`:\n{stderr}"
    );
    assert!(stderr.contains(&auth.url), "names the server:\n{stderr}");
    log.add("refused status", &out);

    let mut w = auth.worker("refused", &[]);
    let st = w.wait(REFUSED);
    let text = w.log();
    assert_eq!(st.code(), Some(1), "worker exits 1:\n{text}");
    assert!(text.contains(cause), "worker names `{cause}`:\n{text}");
    log.add_text("refused worker", text);
}

/// A CA and the certificates it signs, as PEM files in a temporary folder.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Pki {
        Pki {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A self-signed CA `name`: writes `<name>.pem` and returns its issuer.
    fn ca(&self, name: &str) -> rcgen::CertifiedIssuer<'static, rcgen::KeyPair> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("rsembed test {name}"));
        let ca = rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap())
            .unwrap();
        std::fs::write(self.path(&format!("{name}.pem")), ca.pem()).unwrap();
        ca
    }

    /// A leaf certificate for 127.0.0.1 signed by `ca`: `<name>.pem` and
    /// `<name>-key.pem`.
    fn leaf(
        &self,
        name: &str,
        ca: &rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
        usage: rcgen::ExtendedKeyUsagePurpose,
    ) {
        let mut params =
            rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
                .unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("rsembed test {name}"));
        params.extended_key_usages = vec![usage];
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, ca).unwrap();
        std::fs::write(self.path(&format!("{name}.pem")), cert.pem()).unwrap();
        std::fs::write(self.path(&format!("{name}-key.pem")), key.serialize_pem()).unwrap();
    }
}

impl Pki {
    /// A self-signed X.509 v1 certificate made as OpenSSL 3.0 makes one from
    /// a request without extensions: `<name>.pem` and `<name>-key.pem`.
    fn v1_leaf(&self, name: &str) {
        let (cert, key, csr) = (
            self.path(&format!("{name}.pem")),
            self.path(&format!("{name}-key.pem")),
            self.path(&format!("{name}.csr")),
        );
        let openssl = |args: &[&std::ffi::OsStr]| {
            let o = run(std::process::Command::new("openssl").args(args));
            assert!(
                o.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            String::from_utf8_lossy(&o.stdout).into_owned()
        };
        let os = |s: &'static str| std::ffi::OsStr::new(s);
        openssl(&[
            os("req"),
            os("-new"),
            os("-newkey"),
            os("ec"),
            os("-pkeyopt"),
            os("ec_paramgen_curve:P-256"),
            os("-nodes"),
            os("-subj"),
            os("/CN=rsembed v1"),
            os("-keyout"),
            key.as_os_str(),
            os("-out"),
            csr.as_os_str(),
        ]);
        openssl(&[
            os("x509"),
            os("-req"),
            os("-days"),
            os("1"),
            os("-in"),
            csr.as_os_str(),
            os("-signkey"),
            key.as_os_str(),
            os("-out"),
            cert.as_os_str(),
        ]);
        let text = openssl(&[
            os("x509"),
            os("-noout"),
            os("-text"),
            os("-in"),
            cert.as_os_str(),
        ]);
        assert!(
            text.contains("Version: 1 (0x0)"),
            "the fixture is v1:\n{text}"
        );
    }
}

#[test]
fn tls_with_client_certificates_every_command_connects() {
    use rcgen::ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
    let pki = Pki::new();
    let ca = pki.ca("ca");
    pki.leaf("server", &ca, ServerAuth);
    pki.leaf("client", &ca, ClientAuth);
    // A CA the server does not trust, and a client certificate it signed.
    let rogue = pki.ca("rogue");
    pki.leaf("rogue-client", &rogue, ClientAuth);

    let nats = NatsServer::start_with_config(&format!(
        "tls {{\n  cert_file: {:?}\n  key_file: {:?}\n  ca_file: {:?}\n  verify: true\n  timeout: 5\n}}\n",
        pki.path("server.pem"),
        pki.path("server-key.pem"),
        pki.path("ca.pem"),
    ));
    assert!(nats.url().starts_with("tls://"));
    let auth = Auth::new(&nats.url())
        .arg("--nats-tls-ca", pki.path("ca.pem"))
        .arg("--nats-tls-cert", pki.path("client.pem"))
        .arg("--nats-tls-key", pki.path("client-key.pem"));
    let mut log = Transcript::default();
    job_with_every_command(&auth, &mut log);

    // No client certificate: the server refuses the handshake.
    let no_cert = Auth::new(&nats.url()).arg("--nats-tls-ca", pki.path("ca.pem"));
    refused(&no_cert, "TLS failed", &mut log);
    // A client certificate from a CA the server does not trust.
    let untrusted = Auth::new(&nats.url())
        .arg("--nats-tls-ca", pki.path("ca.pem"))
        .arg("--nats-tls-cert", pki.path("rogue-client.pem"))
        .arg("--nats-tls-key", pki.path("rogue-client-key.pem"));
    refused(&untrusted, "TLS failed", &mut log);
    // The client does not trust the server's CA.
    let wrong_ca = Auth::new(&nats.url())
        .arg("--nats-tls-ca", pki.path("rogue.pem"))
        .arg("--nats-tls-cert", pki.path("client.pem"))
        .arg("--nats-tls-key", pki.path("client-key.pem"));
    refused(&wrong_ca, "TLS failed", &mut log);
    // An X.509 v1 client certificate, as OpenSSL 3.0's `x509 -req` makes
    // without extensions: no handshake takes place, and the error says why.
    pki.v1_leaf("v1-client");
    let v1 = Auth::new(&nats.url())
        .arg("--nats-tls-ca", pki.path("ca.pem"))
        .arg("--nats-tls-cert", pki.path("v1-client.pem"))
        .arg("--nats-tls-key", pki.path("v1-client-key.pem"));
    let dir = tempfile::tempdir().unwrap();
    let out = run_timeout(
        v1.rsembed("status").arg("--output").arg(dir.path()),
        REFUSED,
    );
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    for says in ["v1-client.pem", "X.509 v1", "need v3", "-extfile"] {
        assert!(stderr.contains(says), "says `{says}`:\n{stderr}");
    }
    log.add("v1 certificate", &out);
    let mut w = v1.worker("v1", &[]);
    let st = w.wait(REFUSED);
    let text = w.log();
    assert_eq!(st.code(), Some(1), "worker exits 1:\n{text}");
    assert!(text.contains("X.509 v1"), "{text}");

    // The private key's body is the secret of this method.
    let key = std::fs::read_to_string(pki.path("client-key.pem")).unwrap();
    let body = key.lines().nth(1).expect("a PEM body line").to_owned();
    log.assert_no_secrets(&[body]);
}

#[test]
fn user_and_password_every_command_connects() {
    let password = "pw-Zq8fV3kR1s";
    let config = |user: &str| {
        format!(
            "authorization {{\n  users = [ {{ user: {user:?}, password: {password:?} }} ]\n}}\n"
        )
    };
    let nats = NatsServer::start_with_config(&config("rsembed"));
    // The password through the environment, as the help recommends.
    let auth = Auth::new(&nats.url())
        .arg("--nats-user", "rsembed")
        .env("RSEMBED_NATS_PASSWORD", password)
        .secret(password);
    let mut log = Transcript::default();
    job_with_every_command(&auth, &mut log);

    let wrong = "pw-wrong-Hn4tD2";
    let bad = Auth::new(&nats.url())
        .arg("--nats-user", "rsembed")
        .arg("--nats-password", wrong);
    refused(&bad, "authorization failed", &mut log);
    // Credentials in the URL are hidden when the URL is printed.
    let port = nats.url().rsplit(':').next().unwrap().to_owned();
    let in_url = Auth::new(&format!("nats://rsembed:{wrong}@127.0.0.1:{port}"));
    let dir = tempfile::tempdir().unwrap();
    let out = run_timeout(
        in_url.rsembed("status").arg("--output").arg(dir.path()),
        REFUSED,
    );
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("nats://<hidden>@127.0.0.1:{port}"))
            && stderr.contains("authorization failed"),
        "{stderr}"
    );
    log.add("status with credentials in the URL", &out);
    log.assert_no_secrets(&[password.to_owned(), wrong.to_owned()]);
}

#[test]
fn token_every_command_connects() {
    let token = "tok-Rb7Wm2Kx9p";
    let nats =
        NatsServer::start_with_config(&format!("authorization {{\n  token: {token:?}\n}}\n"));
    // The token as a flag: what is on the command line is not echoed either.
    let auth = Auth::new(&nats.url())
        .arg("--nats-token", token)
        .secret(token);
    let mut log = Transcript::default();
    job_with_every_command(&auth, &mut log);

    let wrong = "tok-wrong-Pq3Vn8";
    let bad = Auth::new(&nats.url()).env("RSEMBED_NATS_TOKEN", wrong);
    refused(&bad, "authorization failed", &mut log);
    log.assert_no_secrets(&[token.to_owned(), wrong.to_owned()]);
}

#[test]
fn nkey_every_command_connects() {
    let user = nkeys::KeyPair::new_user();
    let seed = user.seed().unwrap();
    let nats = NatsServer::start_with_config(&format!(
        "authorization {{\n  users = [ {{ nkey: {:?} }} ]\n}}\n",
        user.public_key()
    ));
    let dir = tempfile::tempdir().unwrap();
    let seed_file = dir.path().join("user.nk");
    std::fs::write(&seed_file, format!("{seed}\n")).unwrap();
    let auth = Auth::new(&nats.url()).arg("--nats-nkey", &seed_file);
    let mut log = Transcript::default();
    job_with_every_command(&auth, &mut log);

    // A valid seed of a user the server does not know.
    let stranger = nkeys::KeyPair::new_user().seed().unwrap();
    let stranger_file = dir.path().join("stranger.nk");
    std::fs::write(&stranger_file, &stranger).unwrap();
    let bad = Auth::new(&nats.url()).arg("--nats-nkey", &stranger_file);
    refused(&bad, "authorization failed", &mut log);
    log.assert_no_secrets(&[seed, stranger]);
}

/// Status code and body of one GET; `None` while nothing listens.
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let (status, body) = http_get(port, path)?;
    let code = status.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body))
}

fn wait_readyz(w: &Worker, port: u16, want: impl Fn(u16, &str) -> bool) -> String {
    let started = Instant::now();
    loop {
        if let Some((code, body)) = get(port, "/readyz") {
            if want(code, &body) {
                return body;
            }
        }
        assert!(
            started.elapsed() < FINISH,
            "/readyz never answered as expected (last: {:?})\n{}",
            get(port, "/readyz"),
            w.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_worker_whose_user_is_removed_says_so_in_readyz() {
    let password = "pw-Lm5Xc7Tq2w";
    let config = |user: &str| {
        format!(
            "authorization {{\n  users = [ {{ user: {user:?}, password: {password:?} }} ]\n}}\n"
        )
    };
    let nats = NatsServer::start_with_config(&config("rsembed"));
    let auth = Auth::new(&nats.url())
        .arg("--nats-user", "rsembed")
        .env("RSEMBED_NATS_PASSWORD", password);
    let port = free_port();
    let w = auth.worker("w", &["--http-addr", &format!("127.0.0.1:{port}")]);
    wait_readyz(&w, port, |c, b| c == 200 && b == "ready\n");

    // The operator removes the worker's user and reloads the server.
    nats.reload(&config("someone-else"));
    // The server drops the connection first ("NATS disconnected"); the
    // refused reconnect that follows is what readyz must end up naming.
    let why = wait_readyz(&w, port, |c, b| {
        c == 503 && b.contains("authorization failed")
    });
    assert!(why.contains("authorization failed"), "{why}\n{}", w.log());
    // Still alive: restarting it would not help, and it recovers by itself
    // once the user is back.
    assert_eq!(get(port, "/healthz").map(|(c, _)| c), Some(200));
    nats.reload(&config("rsembed"));
    wait_readyz(&w, port, |c, b| c == 200 && b == "ready\n");
    let mut log = Transcript::default();
    log.add_text("worker", w.log());
    log.assert_no_secrets(&[password.to_owned()]);
}

#[test]
fn help_shows_no_secret_from_the_environment() {
    let (password, token) = ("pw-Help9Dk3", "tok-Help4Jz8");
    let mut log = Transcript::default();
    for (bin, sub) in [
        ("rsembed", Some("submit")),
        ("rsembed", Some("status")),
        ("rsembed", Some("finalize")),
        ("rsembed-worker", None),
    ] {
        let mut c = Command::new(binary(bin));
        c.args(sub)
            .arg("--help")
            .env("RSEMBED_NATS_PASSWORD", password)
            .env("RSEMBED_NATS_TOKEN", token);
        let out = run(&mut c);
        assert!(out.status.success());
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("--nats-password"),
            "{bin} {sub:?} documents the flag"
        );
        log.add(&format!("{bin} {sub:?} --help"), &out);
    }
    log.assert_no_secrets(&[password.to_owned(), token.to_owned()]);
}

#[tokio::test]
async fn a_server_list_connects_past_a_dead_url() {
    let nats = NatsServer::start();
    let dead = format!("nats://127.0.0.1:{}", free_port());
    let list = format!("{dead},{}", nats.url());
    // Several tries: the client shuffles the list, so the dead URL comes
    // first in some of them.
    for _ in 0..4 {
        let args = rsembed_worker::queue::NatsArgs::plain(&list);
        let client = tokio::time::timeout(REFUSED, args.connect("list"))
            .await
            .expect("connects in time")
            .unwrap_or_else(|e| panic!("{list}: {e}"));
        client.flush().await.unwrap();
    }
}

/// A JWT as nats-server's operator mode reads it: `claims` signed with the
/// issuer's NKey (ed25519), `iss`, `iat` and `jti` filled in.
fn nats_jwt(issuer: &nkeys::KeyPair, mut claims: serde_json::Value) -> String {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
    use base64::Engine;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    claims["iss"] = issuer.public_key().into();
    claims["iat"] = now.into();
    claims["jti"] = format!("rsembed-test-{now}-{}", claims["sub"]).into();
    let header = B64.encode(r#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let body = B64.encode(claims.to_string());
    let signed = format!("{header}.{body}");
    let sig = B64.encode(issuer.sign(signed.as_bytes()).unwrap());
    format!("{signed}.{sig}")
}

/// A `.creds` file: the user's JWT and its seed, in the format `nsc` writes.
fn creds_file(jwt: &str, seed: &str) -> String {
    format!(
        "-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n\
         ************************* IMPORTANT *************************\n\
         NKEY Seed printed below can be used to sign and prove identity.\n\n\
         -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n"
    )
}

#[test]
fn creds_file_every_command_connects() {
    use serde_json::json;
    let operator = nkeys::KeyPair::new_operator();
    let account = nkeys::KeyPair::new_account();
    let system = nkeys::KeyPair::new_account();
    let op_jwt = nats_jwt(
        &operator,
        json!({"sub": operator.public_key(), "name": "rsembed-test",
               "nats": {"type": "operator", "version": 2}}),
    );
    let unlimited = json!({"subs": -1, "data": -1, "payload": -1, "imports": -1,
        "exports": -1, "wildcards": true, "conn": -1, "leaf": -1,
        "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1});
    let acc_jwt = nats_jwt(
        &operator,
        json!({"sub": account.public_key(), "name": "rsembed",
               "nats": {"limits": unlimited, "type": "account", "version": 2}}),
    );
    let sys_jwt = nats_jwt(
        &operator,
        json!({"sub": system.public_key(), "name": "SYS",
               "nats": {"type": "account", "version": 2}}),
    );
    let user_jwt = |user: &nkeys::KeyPair| {
        nats_jwt(
            &account,
            json!({"sub": user.public_key(), "name": "worker",
                   "nats": {"pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1,
                            "type": "user", "version": 2}}),
        )
    };
    let nats = NatsServer::start_with_config(&format!(
        "operator: {op_jwt:?}\nsystem_account: {:?}\nresolver: MEMORY\n\
         resolver_preload: {{\n  {}: {acc_jwt:?}\n  {}: {sys_jwt:?}\n}}\n",
        system.public_key(),
        account.public_key(),
        system.public_key(),
    ));
    let dir = tempfile::tempdir().unwrap();
    let user = nkeys::KeyPair::new_user();
    let seed = user.seed().unwrap();
    let creds = dir.path().join("user.creds");
    std::fs::write(&creds, creds_file(&user_jwt(&user), &seed)).unwrap();
    let auth = Auth::new(&nats.url()).arg("--nats-creds", &creds);
    let mut log = Transcript::default();
    job_with_every_command(&auth, &mut log);

    // A user JWT signed by an account the operator never issued.
    let rogue_account = nkeys::KeyPair::new_account();
    let stranger = nkeys::KeyPair::new_user();
    let stranger_seed = stranger.seed().unwrap();
    let rogue_jwt = nats_jwt(
        &rogue_account,
        json!({"sub": stranger.public_key(), "name": "stranger",
               "nats": {"pub": {}, "sub": {}, "type": "user", "version": 2}}),
    );
    let bad_creds = dir.path().join("stranger.creds");
    std::fs::write(&bad_creds, creds_file(&rogue_jwt, &stranger_seed)).unwrap();
    let bad = Auth::new(&nats.url()).arg("--nats-creds", &bad_creds);
    refused(&bad, "authorization failed", &mut log);
    log.assert_no_secrets(&[seed, stranger_seed]);
}
