//! Reaching NATS: the `--nats` URL list and its credentials, the
//! authentication and TLS flags ([`NatsArgs`]), connecting, and following the
//! connection's problems for readiness ([`ConnectionWatch`]).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::config::{QueueError, MIN_SERVER};

/// Connects to NATS without authentication, reconnecting forever after a
/// connection loss, and refuses a server older than [`MIN_SERVER`].
pub async fn connect(url: &str) -> Result<async_nats::Client, QueueError> {
    connect_with(url, async_nats::ConnectOptions::new().max_reconnects(None)).await
}

/// Makes aws-lc-rs the process's rustls crypto provider unless one is set.
///
/// Both rustls providers are compiled into these binaries (async-nats asks
/// for ring, reqwest for aws-lc-rs), and then rustls cannot pick one itself:
/// async-nats's `ClientConfig::builder()` panicked on every TLS connection.
/// aws-lc-rs is what reqwest already uses when no default is set, so object
/// store traffic keeps its provider whichever connection comes first
/// (docs/decisions.md). A provider a library user installed is kept.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

/// Connects with `options` to `urls` (one URL, or several comma-separated:
/// the client tries each and fails over between them) and refuses a server
/// older than [`MIN_SERVER`].
///
/// The first connection is tried once, so a wrong URL, credential or
/// certificate is an error at start rather than a silent retry loop.
pub(crate) async fn connect_with(
    urls: &str,
    options: async_nats::ConnectOptions,
) -> Result<async_nats::Client, QueueError> {
    install_crypto_provider();
    let (servers, in_url) = parse_servers(urls)?;
    // As the client would use them, but set on the options: the client logs
    // its server addresses at debug level, user information included.
    let options = match in_url {
        Some(UrlCredentials::UserPassword(u, p)) => options.user_and_password(u, p),
        Some(UrlCredentials::Token(t)) => options.token(t),
        None => options,
    };
    let client = options
        .connect(servers)
        .await
        .map_err(|source| QueueError::Connect {
            url: redact_urls(urls),
            cause: diagnose(&source),
            source,
        })?;
    let version = client.server_info().version;
    if !server_supported(&version) {
        return Err(QueueError::OldServer {
            url: redact_urls(urls),
            version,
        });
    }
    Ok(client)
}

/// `urls` with the user information of each URL (`user:password@`,
/// `token@`) hidden, for errors and logs.
pub fn redact_urls(urls: &str) -> String {
    urls.split(',')
        .map(|u| {
            let lead = u.len() - u.trim_start().len();
            let start = u.find("://").map_or(lead, |i| i + 3);
            match u[start..].rfind('@') {
                Some(at) => format!("{}<hidden>@{}", &u[..start], &u[start + at + 1..]),
                None => u.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Credentials written into a `--nats` URL (`user:password@`, `token@`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum UrlCredentials {
    /// `nats://user:password@host`.
    UserPassword(String, String),
    /// `nats://token@host`.
    Token(String),
}

/// The server addresses of a comma-separated `--nats` list, without user
/// information, and the credentials of the first URL that has some.
pub(crate) fn parse_servers(
    urls: &str,
) -> Result<(Vec<async_nats::ServerAddr>, Option<UrlCredentials>), QueueError> {
    let mut creds = None;
    let mut servers = Vec::new();
    for u in urls.split(',').map(str::trim).filter(|u| !u.is_empty()) {
        let bad = |e: &dyn std::fmt::Display| QueueError::Option {
            option: "--nats",
            message: format!("`{}` is not a NATS URL: {e}", redact_urls(u)),
        };
        let full = if u.contains("://") {
            u.to_owned()
        } else {
            format!("nats://{u}")
        };
        let mut url = url::Url::parse(&full).map_err(|e| bad(&e))?;
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        };
        let found = match (url.username(), url.password()) {
            ("", None) => None,
            (user, Some(pw)) => Some(UrlCredentials::UserPassword(decode(user), decode(pw))),
            (token, None) => Some(UrlCredentials::Token(decode(token))),
        };
        if found.is_some() {
            creds = creds.or(found);
            let _ = url.set_username("");
            let _ = url.set_password(None);
        }
        servers.push(
            url.as_str()
                .parse::<async_nats::ServerAddr>()
                .map_err(|e| bad(&e))?,
        );
    }
    if servers.is_empty() {
        return Err(QueueError::Option {
            option: "--nats",
            message: format!("`{}` names no server", redact_urls(urls)),
        });
    }
    Ok((servers, creds))
}

/// What a failed connection means for the user, from the client's error:
/// the kind async-nats sets, or a rustls error inside an I/O error (a TLS
/// handshake the server or the client refused).
fn diagnose(err: &async_nats::ConnectError) -> &'static str {
    use async_nats::ConnectErrorKind as K;
    match err.kind() {
        K::AuthorizationViolation | K::Authentication => ConnectionProblem::Authorization.reason(),
        K::Tls => ConnectionProblem::Tls.reason(),
        K::TimedOut => "the server did not answer in time",
        _ if is_tls_error(err) => ConnectionProblem::Tls.reason(),
        _ => "the server cannot be reached",
    }
}

/// Whether a rustls error is somewhere in `err`'s sources.
fn is_tls_error(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if e.is::<rustls::Error>() {
            return true;
        }
        if let Some(inner) = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            if inner.is::<rustls::Error>() {
                return true;
            }
        }
        cur = e.source();
    }
    false
}

/// Why the NATS connection is down, as far as the client's events say:
/// readiness (`/readyz`) names it, because a worker whose credentials the
/// server stopped accepting retries forever and needs an operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionProblem {
    /// Nothing known beyond the connection state.
    Unknown,
    /// The server refused the credentials (authorization violation, a
    /// nonce that could not be signed, expired credentials).
    Authorization,
    /// The TLS handshake failed (certificate not trusted or refused).
    Tls,
}

impl ConnectionProblem {
    /// The reason as readiness and errors print it.
    pub fn reason(self) -> &'static str {
        match self {
            ConnectionProblem::Unknown => "the server cannot be reached",
            ConnectionProblem::Authorization => {
                "authorization failed: the server refused the credentials \
                 (--nats-user/--nats-password, --nats-token, --nats-nkey or --nats-creds)"
            }
            ConnectionProblem::Tls => {
                "TLS failed: the handshake was refused \
                 (--nats-tls-ca, --nats-tls-cert/--nats-tls-key)"
            }
        }
    }
}

/// The last connection problem the NATS client reported, shared with
/// readiness; cleared when the client connects again.
#[derive(Debug, Clone, Default)]
pub struct ConnectionWatch {
    problem: Arc<AtomicU8>,
}

impl ConnectionWatch {
    /// A watch with no problem seen.
    pub fn new() -> ConnectionWatch {
        ConnectionWatch::default()
    }

    /// The last problem seen since the last successful connection.
    pub(crate) fn problem(&self) -> ConnectionProblem {
        match self.problem.load(Ordering::Acquire) {
            1 => ConnectionProblem::Authorization,
            2 => ConnectionProblem::Tls,
            _ => ConnectionProblem::Unknown,
        }
    }

    fn set(&self, p: ConnectionProblem) {
        let v = match p {
            ConnectionProblem::Unknown => 0,
            ConnectionProblem::Authorization => 1,
            ConnectionProblem::Tls => 2,
        };
        self.problem.store(v, Ordering::Release);
    }

    /// Follows one client event.
    pub(crate) fn observe(&self, event: &async_nats::Event) {
        use async_nats::{ClientError, Event, ServerError};
        match event {
            Event::Connected => self.set(ConnectionProblem::Unknown),
            Event::ServerError(ServerError::AuthorizationViolation) => {
                self.set(ConnectionProblem::Authorization)
            }
            // Other server errors carry the server's text ("Authentication
            // Timeout", "User Authentication Expired"); reconnect failures
            // carry the connect error kind's text.
            Event::ServerError(ServerError::Other(text))
            | Event::ClientError(ClientError::Other(text)) => {
                if let Some(p) = classify(text) {
                    self.set(p);
                }
            }
            _ => {}
        }
    }
}

/// The problem a client or server error text names, if any.
fn classify(text: &str) -> Option<ConnectionProblem> {
    let t = text.to_lowercase();
    if t.contains("authoriz") || t.contains("authenticat") || t.contains("signing nonce") {
        Some(ConnectionProblem::Authorization)
    } else if t.contains("tls") || t.contains("certificate") {
        Some(ConnectionProblem::Tls)
    } else {
        None
    }
}

/// Refuses a client certificate rustls cannot present, with why and how to
/// mend it: an X.509 v1 certificate (OpenSSL's `x509 -req` without
/// extensions makes one) fails inside the client before any handshake, which
/// the connection error would only call a refused handshake.
fn check_client_certificate(path: &std::path::Path) -> Result<(), QueueError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let bad = |message: String| QueueError::Option {
        option: "--nats-tls-cert",
        message: format!("{}: {message}", path.display()),
    };
    let first = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(format!("cannot read it as PEM: {e}")))?
        .next()
        .ok_or_else(|| bad("holds no PEM certificate".into()))?
        .map_err(|e| bad(format!("cannot read it as PEM: {e}")))?;
    match webpki::EndEntityCert::try_from(&first) {
        Ok(_) => Ok(()),
        Err(webpki::Error::UnsupportedCertVersion) => Err(bad(
            "the certificate is X.509 v1, and TLS clients need v3 (no handshake was attempted). \
             OpenSSL's `x509 -req` makes v1 when no extensions are given: re-issue it with \
             extensions, e.g. `openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key \
             -CAcreateserial -days 365 -out client.pem -extfile <(printf \
             'basicConstraints=CA:FALSE\\nkeyUsage=digitalSignature\\nextendedKeyUsage=clientAuth')`"
                .into(),
        )),
        Err(e) => Err(bad(format!("not a certificate TLS can use: {e}"))),
    }
}

/// Whether a nats-server version string (`2.10.3`, `v2.15.1`, `2.11.0-beta.1`)
/// is at least [`MIN_SERVER`]. A version that does not parse is refused.
pub fn server_supported(version: &str) -> bool {
    let mut parts = version.trim().trim_start_matches('v').split(['.', '-']);
    let mut num = || parts.next().and_then(|p| p.parse::<u64>().ok());
    match (num(), num()) {
        (Some(major), Some(minor)) => (major, minor) >= MIN_SERVER,
        _ => false,
    }
}

/// How to reach NATS: `--nats` and its authentication and TLS flags, shared by
/// `rsembed submit | status | finalize` and `rsembed-worker`.
///
/// Secrets (password, token, NKey seed) are never printed: `Debug` hides them.
#[derive(Clone, clap::Args)]
pub struct NatsArgs {
    /// NATS server URL(s), comma-separated (`nats://host:4222`, `tls://...`).
    #[arg(long, env = "RSEMBED_NATS")]
    pub nats: String,
    /// User name (with `--nats-password`).
    #[arg(long, env = "RSEMBED_NATS_USER")]
    pub nats_user: Option<String>,
    /// Password (with `--nats-user`); prefer the environment variable.
    #[arg(long, env = "RSEMBED_NATS_PASSWORD", hide_env_values = true)]
    pub nats_password: Option<String>,
    /// Authentication token; prefer the environment variable.
    #[arg(long, env = "RSEMBED_NATS_TOKEN", hide_env_values = true)]
    pub nats_token: Option<String>,
    /// File holding an NKey seed (`SU...`).
    #[arg(long, env = "RSEMBED_NATS_NKEY")]
    pub nats_nkey: Option<PathBuf>,
    /// Credentials file (`.creds`: a user JWT and its NKey seed).
    #[arg(long, env = "RSEMBED_NATS_CREDS")]
    pub nats_creds: Option<PathBuf>,
    /// CA certificate (PEM) to verify the server with; implies TLS.
    #[arg(long, env = "RSEMBED_NATS_TLS_CA")]
    pub nats_tls_ca: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS, with `--nats-tls-key`.
    #[arg(long, env = "RSEMBED_NATS_TLS_CERT")]
    pub nats_tls_cert: Option<PathBuf>,
    /// Client key (PEM) for mutual TLS, with `--nats-tls-cert`.
    #[arg(long, env = "RSEMBED_NATS_TLS_KEY")]
    pub nats_tls_key: Option<PathBuf>,
    /// Require TLS even when the URL does not ask for it.
    #[arg(long, env = "RSEMBED_NATS_TLS")]
    pub nats_tls: bool,
}

impl std::fmt::Debug for NatsArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hidden = |o: &Option<String>| o.as_ref().map(|_| "<hidden>");
        f.debug_struct("NatsArgs")
            .field("nats", &redact_urls(&self.nats))
            .field("nats_user", &self.nats_user)
            .field("nats_password", &hidden(&self.nats_password))
            .field("nats_token", &hidden(&self.nats_token))
            .field("nats_nkey", &self.nats_nkey)
            .field("nats_creds", &self.nats_creds)
            .field("nats_tls_ca", &self.nats_tls_ca)
            .field("nats_tls_cert", &self.nats_tls_cert)
            .field("nats_tls_key", &self.nats_tls_key)
            .field("nats_tls", &self.nats_tls)
            .finish()
    }
}

impl NatsArgs {
    /// Plain `--nats <url>` with no authentication (tests, local servers).
    pub fn plain(url: &str) -> NatsArgs {
        NatsArgs {
            nats: url.into(),
            nats_user: None,
            nats_password: None,
            nats_token: None,
            nats_nkey: None,
            nats_creds: None,
            nats_tls_ca: None,
            nats_tls_cert: None,
            nats_tls_key: None,
            nats_tls: false,
        }
    }

    async fn options(
        &self,
        name: &str,
        watch: &ConnectionWatch,
    ) -> Result<async_nats::ConnectOptions, QueueError> {
        let watch = watch.clone();
        let mut o = async_nats::ConnectOptions::new()
            .name(name)
            // A worker outlives server restarts and network blips: reconnect
            // forever, with the client's capped exponential backoff.
            .max_reconnects(None)
            .connection_timeout(Duration::from_secs(10))
            .event_callback(move |event| {
                let watch = watch.clone();
                async move { watch.observe(&event) }
            });
        match (&self.nats_user, &self.nats_password) {
            (Some(u), Some(p)) => o = o.user_and_password(u.clone(), p.clone()),
            (None, None) => {}
            _ => {
                return Err(QueueError::Option {
                    option: "--nats-user/--nats-password",
                    message: "give both or neither".into(),
                })
            }
        }
        if let Some(t) = &self.nats_token {
            o = o.token(t.clone());
        }
        if let Some(path) = &self.nats_nkey {
            let seed = std::fs::read_to_string(path).map_err(|e| QueueError::Option {
                option: "--nats-nkey",
                message: format!("{}: {e}", path.display()),
            })?;
            o = o.nkey(seed.trim().to_owned());
        }
        if let Some(path) = &self.nats_creds {
            o = o
                .credentials_file(path)
                .await
                .map_err(|e| QueueError::Option {
                    option: "--nats-creds",
                    message: format!("{}: {e}", path.display()),
                })?;
        }
        if let Some(ca) = &self.nats_tls_ca {
            o = o.add_root_certificates(ca.clone()).require_tls(true);
        }
        match (&self.nats_tls_cert, &self.nats_tls_key) {
            (Some(c), Some(k)) => {
                check_client_certificate(c)?;
                o = o
                    .add_client_certificate(c.clone(), k.clone())
                    .require_tls(true)
            }
            (None, None) => {}
            _ => {
                return Err(QueueError::Option {
                    option: "--nats-tls-cert/--nats-tls-key",
                    message: "give both or neither".into(),
                })
            }
        }
        if self.nats_tls {
            o = o.require_tls(true);
        }
        Ok(o)
    }

    /// Connects (see `connect_with`).
    pub async fn connect(&self, name: &str) -> Result<async_nats::Client, QueueError> {
        self.connect_watched(name, &ConnectionWatch::new()).await
    }

    /// Connects, and keeps `watch` up to date with the connection's problems
    /// (for readiness).
    pub async fn connect_watched(
        &self,
        name: &str,
        watch: &ConnectionWatch,
    ) -> Result<async_nats::Client, QueueError> {
        connect_with(&self.nats, self.options(name, watch).await?).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_versions() {
        for ok in ["2.10.0", "v2.15.1", "2.11.0-beta.1", "3.0.0", "2.10"] {
            assert!(server_supported(ok), "{ok}");
        }
        for old in ["2.9.25", "v2.9.0", "1.4.1", "", "dev", "2"] {
            assert!(!server_supported(old), "{old}");
        }
    }

    #[test]
    fn old_server_error_names_the_version() {
        let e = QueueError::OldServer {
            url: "nats://h:4222".into(),
            version: "2.9.25".into(),
        };
        assert_eq!(
            e.to_string(),
            "nats-server 2.9.25 at nats://h:4222 is too old: rsembed needs nats-server >= 2.10"
        );
    }

    #[test]
    fn a_server_list_is_split_on_commas() {
        let (servers, creds) = parse_servers("nats://a:4222, tls://b:4223,,c").unwrap();
        assert_eq!(creds, None);
        let hosts: Vec<_> = servers.iter().map(|s| (s.host(), s.port())).collect();
        assert_eq!(hosts, [("a", 4222), ("b", 4223), ("c", 4222)]);
        assert!(servers[1].tls_required());
        let e = parse_servers("nats://a:4222,nats://b:notaport").unwrap_err();
        assert!(
            e.to_string()
                .contains("`nats://b:notaport` is not a NATS URL"),
            "{e}"
        );
        assert!(parse_servers(" , ").is_err());
        // Credentials move from the URL to the options, so the client
        // never logs them as part of an address.
        let (servers, creds) = parse_servers("nats://u:p%40ss@h:1,tok@g:2").unwrap();
        assert_eq!(
            creds,
            Some(UrlCredentials::UserPassword("u".into(), "p@ss".into()))
        );
        assert!(servers
            .iter()
            .all(|s| s.username().is_none() && s.password().is_none()));
        let (_, creds) = parse_servers("tok@g:2").unwrap();
        assert_eq!(creds, Some(UrlCredentials::Token("tok".into())));
    }

    #[test]
    fn client_events_set_and_clear_the_connection_problem() {
        use async_nats::{ClientError, Event, ServerError};
        let w = ConnectionWatch::new();
        assert_eq!(w.problem(), ConnectionProblem::Unknown);
        w.observe(&Event::ServerError(ServerError::AuthorizationViolation));
        assert_eq!(w.problem(), ConnectionProblem::Authorization);
        w.observe(&Event::Disconnected);
        assert_eq!(w.problem(), ConnectionProblem::Authorization, "kept");
        w.observe(&Event::Connected);
        assert_eq!(w.problem(), ConnectionProblem::Unknown);
        // The reconnect loop reports the connect error kind's text.
        w.observe(&Event::ClientError(ClientError::Other(
            async_nats::ConnectErrorKind::AuthorizationViolation.to_string(),
        )));
        assert_eq!(w.problem(), ConnectionProblem::Authorization);
        w.observe(&Event::ClientError(ClientError::Other(
            async_nats::ConnectErrorKind::Tls.to_string(),
        )));
        assert_eq!(w.problem(), ConnectionProblem::Tls);
        w.observe(&Event::ServerError(ServerError::Other(
            "User Authentication Expired".into(),
        )));
        assert_eq!(w.problem(), ConnectionProblem::Authorization);
        w.observe(&Event::ClientError(ClientError::Other("IO error".into())));
        assert_eq!(w.problem(), ConnectionProblem::Authorization, "unchanged");
    }

    #[test]
    fn connect_errors_say_what_failed() {
        use async_nats::{ConnectError, ConnectErrorKind as K};
        let auth = ConnectError::new(K::AuthorizationViolation);
        assert!(diagnose(&auth).starts_with("authorization failed"));
        let tls = ConnectError::with_source(
            K::Io,
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
            ),
        );
        assert!(diagnose(&tls).starts_with("TLS failed"));
        let refused = ConnectError::with_source(
            K::Io,
            std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        );
        assert_eq!(diagnose(&refused), "the server cannot be reached");
    }

    #[test]
    fn secrets_are_not_printed() {
        let mut a = NatsArgs::plain("nats://u:pw-secret@h:4222,tls://tok-secret@g");
        a.nats_password = Some("hunter2".into());
        a.nats_user = Some("u".into());
        a.nats_token = Some("tok-secret".into());
        let s = format!("{a:?}");
        assert!(
            !s.contains("hunter2") && !s.contains("tok-secret") && !s.contains("pw-secret"),
            "{s}"
        );
        assert!(s.contains("<hidden>"));
        assert_eq!(
            redact_urls("nats://u:p@h:4222, x@h2,nats://h3"),
            "nats://<hidden>@h:4222, <hidden>@h2,nats://h3"
        );
        let e = parse_servers("nats://u:pw-secret@h:bad").unwrap_err();
        assert!(!e.to_string().contains("pw-secret"), "{e}");
    }
}
