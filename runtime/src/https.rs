//! The HTTPS listener behind `/metrics` and the probes of the operator and the agents.
//!
//! Prometheus and kubelet speak HTTP/1.1 over TLS (no h2 by ALPN), which tonic's TLS
//! server refuses, so they get this small rustls listener under `axum::serve`.
//! Handshakes run on their own tasks, each within [`HANDSHAKE_TIMEOUT`]. At most
//! [`MAX_CONNECTIONS`] connections are open at once (handshaking or served), at most
//! [`MAX_CONNECTIONS_PER_IP`] from one address, each idle for at most [`IDLE_TIMEOUT`] and
//! open for at most [`MAX_CONNECTION_AGE`]:
//! a slow, silent or idle client cannot hold up the others nor pile up memory, and one
//! address cannot starve kubelet's probes, which come from the node's. The TLS configuration is asked of a [`ConfigSource`] at every connection, so a
//! certificate rotated on disk is served from the next connection on. A handler learns
//! who connected from [`Peer`] (`axum::extract::ConnectInfo<Peer>`): the certificate
//! chain the client presented, already verified against the client CA when one is
//! configured.

use std::{
    io,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use rustls::{
    RootCertStore, ServerConfig,
    pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject},
    server::WebPkiClientVerifier,
};
use tokio::{
    net::{TcpListener, TcpStream},
    sync::{Semaphore, mpsc},
};
use tokio_rustls::{TlsAcceptor, server::TlsStream};

/// Connections open at once; more wait in the kernel's backlog.
pub const MAX_CONNECTIONS: usize = 512;
/// Connections open from one address; more are closed at once.
pub const MAX_CONNECTIONS_PER_IP: usize = 8;
/// A connection that moves no byte for this long while waiting is closed (probes and
/// scrapes take milliseconds; a scraper reconnects for its next scrape).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection still open this long after it was accepted is closed the next time it
/// waits for its client (one that trickles a byte now and then cannot stay forever).
pub const MAX_CONNECTION_AGE: Duration = Duration::from_secs(120);
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what}")]
    Read {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("{what}: no usable PEM ({detail})")]
    Pem { what: String, detail: String },
    #[error("TLS configuration")]
    Config(#[from] rustls::Error),
    #[error("client CA")]
    ClientCa(#[from] rustls::server::VerifierBuilderError),
    #[error("binding {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A server configuration for HTTP/1.1 and h2 over TLS with this certificate and key.
/// With `client_ca`, a client may present a certificate, which must chain to that CA
/// (else the handshake fails); one that presents none is let in too, and handlers decide
/// by [`Peer::presents`]: kubelet's HTTPS probes present no certificate.
pub fn server_config(
    cert_pem: &str,
    key_pem: &str,
    client_ca: Option<&str>,
) -> Result<ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs = pem_certs(cert_pem, "serving certificate")?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| Error::Pem {
        what: "serving key".into(),
        detail: e.to_string(),
    })?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let mut cfg = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for c in pem_certs(ca, "client CA")? {
                roots.add(c)?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()?;
            builder.with_client_cert_verifier(verifier)
        }
    }
    .with_single_cert(certs, key)?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(cfg)
}

fn pem_certs(pem: &str, what: &str) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::Pem {
            what: what.into(),
            detail: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(Error::Pem {
            what: what.into(),
            detail: "no CERTIFICATE block".into(),
        });
    }
    Ok(certs)
}

/// Where the listener takes its TLS configuration from, at every connection.
pub trait ConfigSource: Send + Sync + 'static {
    fn current(&self) -> Result<Arc<ServerConfig>>;
}

/// One configuration for the listener's life (the operator issues its serving
/// certificate at start).
pub struct Fixed(pub Arc<ServerConfig>);

impl ConfigSource for Fixed {
    fn current(&self) -> Result<Arc<ServerConfig>> {
        Ok(self.0.clone())
    }
}

/// `tls.crt`, `tls.key` and `ca.crt` of a mounted Secret, rebuilt when one of them
/// changes on disk (kubelet swaps the files of an updated Secret atomically), else the
/// configuration built last: three `stat`s per connection. Files that changed but do not
/// load leave the last good configuration in service; only the first build may fail.
pub struct SecretDir {
    dir: std::path::PathBuf,
    cached: Mutex<Option<Built>>,
    /// The file times of the last rebuild that failed: not retried (nor warned about)
    /// until the files change again.
    failed: Mutex<Option<Vec<Option<SystemTime>>>>,
}

/// A configuration and the modification times of the files it was built from.
struct Built {
    stamps: Vec<Option<SystemTime>>,
    config: Arc<ServerConfig>,
}

impl SecretDir {
    const FILES: [&str; 3] = ["tls.crt", "tls.key", "ca.crt"];

    pub fn new(dir: impl Into<std::path::PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            cached: Mutex::new(None),
            failed: Mutex::new(None),
        }
    }

    fn read(&self, name: &str) -> Result<String> {
        let path = self.dir.join(name);
        std::fs::read_to_string(&path).map_err(|source| Error::Read {
            what: path.display().to_string(),
            source,
        })
    }
}

impl ConfigSource for SecretDir {
    fn current(&self) -> Result<Arc<ServerConfig>> {
        let stamps: Vec<Option<SystemTime>> = Self::FILES
            .iter()
            .map(|f| {
                std::fs::metadata(self.dir.join(f))
                    .and_then(|m| m.modified())
                    .ok()
            })
            .collect();
        let mut cached = self.cached.lock().unwrap_or_else(|p| p.into_inner());
        let mut failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(built) = cached.as_ref()
            && (built.stamps == stamps || failed.as_ref() == Some(&stamps))
        {
            return Ok(built.config.clone());
        }
        let rebuilt = (|| {
            Ok::<_, Error>(Arc::new(server_config(
                &self.read("tls.crt")?,
                &self.read("tls.key")?,
                Some(&self.read("ca.crt")?),
            )?))
        })();
        match (rebuilt, cached.as_ref()) {
            (Ok(cfg), _) => {
                *cached = Some(Built {
                    stamps,
                    config: cfg.clone(),
                });
                *failed = None;
                Ok(cfg)
            }
            // A Secret caught half-written, or replaced by a broken one: keep serving
            // what worked, say so once per change of the files.
            (Err(e), Some(built)) => {
                tracing::warn!(error = %crate::error_chain(&e), dir = %self.dir.display(), "the changed TLS files do not load; serving the previous ones");
                *failed = Some(stamps);
                Ok(built.config.clone())
            }
            (Err(e), None) => Err(e),
        }
    }
}

/// Who is on the other end of a connection.
#[derive(Clone, Debug)]
pub struct Peer {
    pub addr: SocketAddr,
    /// The chain the client presented, verified against the client CA; empty when it
    /// presented none.
    pub certificates: Vec<CertificateDer<'static>>,
}

impl Peer {
    /// Whether the client presented a verified certificate issued for `name` (a DNS
    /// subject alternative name).
    pub fn presents(&self, name: &str) -> bool {
        self.certificates
            .first()
            .is_some_and(|leaf| issued_for(leaf, name))
    }
}

/// Whether `cert` names `name` among its DNS subject alternative names. Says nothing of
/// who issued it: call it on a chain the handshake verified.
pub fn issued_for(cert: &CertificateDer<'_>, name: &str) -> bool {
    let Ok(name) = ServerName::try_from(name) else {
        return false;
    };
    webpki::EndEntityCert::try_from(cert)
        .and_then(|c| c.verify_is_valid_for_subject_name(&name))
        .is_ok()
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, TlsListener>> for Peer {
    fn connect_info(stream: axum::serve::IncomingStream<'_, TlsListener>) -> Self {
        let certificates = stream
            .io()
            .tls()
            .get_ref()
            .1
            .peer_certificates()
            .map(|c| c.iter().map(|c| c.clone().into_owned()).collect())
            .unwrap_or_default();
        Peer {
            addr: *stream.remote_addr(),
            certificates,
        }
    }
}

/// What one listener allows ([`MAX_CONNECTIONS`], [`MAX_CONNECTIONS_PER_IP`],
/// [`IDLE_TIMEOUT`], [`MAX_CONNECTION_AGE`] by default).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub connections: usize,
    pub per_ip: usize,
    pub idle: Duration,
    pub max_age: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            connections: MAX_CONNECTIONS,
            per_ip: MAX_CONNECTIONS_PER_IP,
            idle: IDLE_TIMEOUT,
            max_age: MAX_CONNECTION_AGE,
        }
    }
}

pub struct TlsListener {
    addr: SocketAddr,
    ready: mpsc::Receiver<(Conn, SocketAddr)>,
}

impl TlsListener {
    pub async fn bind(addr: SocketAddr, source: Arc<dyn ConfigSource>) -> Result<Self> {
        Self::bind_with(addr, source, Limits::default()).await
    }

    pub async fn bind_with(
        addr: SocketAddr,
        source: Arc<dyn ConfigSource>,
        limits: Limits,
    ) -> Result<Self> {
        // A configuration that cannot be built fails the start, not each connection.
        source.current()?;
        let tcp = TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Bind { addr, source })?;
        let addr = tcp
            .local_addr()
            .map_err(|source| Error::Bind { addr, source })?;
        let (tx, ready) = mpsc::channel(16);
        let open = Arc::new(Semaphore::new(limits.connections));
        let per_ip = Arc::new(Mutex::new(PerIp::default()));
        tokio::spawn(async move {
            loop {
                let Ok(permit) = open.clone().acquire_owned().await else {
                    return;
                };
                let (sock, peer) = match tcp.accept().await {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::warn!(error = %e, "HTTPS accept");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                if tx.is_closed() {
                    return;
                }
                let accepted = tokio::time::Instant::now();
                let Some(slot) = PerIp::take(&per_ip, peer.ip(), limits.per_ip) else {
                    tracing::debug!(%peer, "too many connections from this address; closed");
                    continue;
                };
                let acceptor = match source.current() {
                    Ok(cfg) => TlsAcceptor::from(cfg),
                    Err(e) => {
                        tracing::warn!(error = %crate::error_chain(&e), "TLS configuration; connection dropped");
                        continue;
                    }
                };
                let tx = tx.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(sock)).await {
                        Ok(Ok(tls)) => {
                            let conn = Conn {
                                tls,
                                idle: limits.idle,
                                end_of_life: accepted + limits.max_age,
                                deadline: Box::pin(tokio::time::sleep(limits.idle)),
                                _held: (permit, slot),
                            };
                            let _ = tx.send((conn, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(Self { addr, ready })
    }
}

/// Connections open per address.
#[derive(Default)]
struct PerIp(std::collections::HashMap<std::net::IpAddr, usize>);

/// One connection of an address; given back on drop.
struct IpSlot(Arc<Mutex<PerIp>>, std::net::IpAddr);

impl PerIp {
    fn take(this: &Arc<Mutex<PerIp>>, ip: std::net::IpAddr, cap: usize) -> Option<IpSlot> {
        let mut map = this.lock().unwrap_or_else(|p| p.into_inner());
        let n = map.0.entry(ip).or_insert(0);
        if *n >= cap {
            return None;
        }
        *n += 1;
        Some(IpSlot(this.clone(), ip))
    }
}

impl Drop for IpSlot {
    fn drop(&mut self) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = map.0.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                map.0.remove(&self.1);
            }
        }
    }
}

/// A served connection: the TLS stream, its timers, and its share of the limits (given
/// back when hyper drops it). Any byte read or written resets the idle timer. An
/// operation that must wait fails once the connection has been idle for `idle`, and a
/// read that must wait fails once the connection is older than its end of life: hyper
/// reads between requests, so a response under way is never cut.
pub struct Conn {
    tls: TlsStream<TcpStream>,
    idle: Duration,
    end_of_life: tokio::time::Instant,
    deadline: std::pin::Pin<Box<tokio::time::Sleep>>,
    _held: (tokio::sync::OwnedSemaphorePermit, IpSlot),
}

impl Conn {
    pub fn tls(&self) -> &TlsStream<TcpStream> {
        &self.tls
    }

    fn progressed(&mut self) {
        let next = tokio::time::Instant::now() + self.idle;
        self.deadline.as_mut().reset(next);
    }

    /// After an operation returned Pending: whether the connection must close now. The
    /// deadline's poll registers the waker that closes an idle connection on time.
    fn timed_out(&mut self, cx: &mut std::task::Context<'_>, reading: bool) -> Option<io::Error> {
        if reading && tokio::time::Instant::now() >= self.end_of_life {
            return Some(io::Error::new(
                io::ErrorKind::TimedOut,
                "the connection reached its maximum age",
            ));
        }
        if reading && self.deadline.deadline() > self.end_of_life {
            let end = self.end_of_life;
            self.deadline.as_mut().reset(end);
        }
        self.deadline
            .as_mut()
            .poll(cx)
            .is_ready()
            .then(|| io::Error::new(io::ErrorKind::TimedOut, "the connection was idle too long"))
    }
}

impl tokio::io::AsyncRead for Conn {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        let before = buf.filled().len();
        match std::pin::Pin::new(&mut self.tls).poll_read(cx, buf) {
            std::task::Poll::Pending => match self.timed_out(cx, true) {
                Some(e) => std::task::Poll::Ready(Err(e)),
                None => std::task::Poll::Pending,
            },
            std::task::Poll::Ready(r) => {
                if buf.filled().len() > before {
                    self.progressed();
                }
                std::task::Poll::Ready(r)
            }
        }
    }
}

impl tokio::io::AsyncWrite for Conn {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        match std::pin::Pin::new(&mut self.tls).poll_write(cx, buf) {
            std::task::Poll::Pending => match self.timed_out(cx, false) {
                Some(e) => std::task::Poll::Ready(Err(e)),
                None => std::task::Poll::Pending,
            },
            std::task::Poll::Ready(r) => {
                if matches!(r, Ok(n) if n > 0) {
                    self.progressed();
                }
                std::task::Poll::Ready(r)
            }
        }
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        match std::pin::Pin::new(&mut self.tls).poll_flush(cx) {
            std::task::Poll::Pending => match self.timed_out(cx, false) {
                Some(e) => std::task::Poll::Ready(Err(e)),
                None => std::task::Poll::Pending,
            },
            ready => ready,
        }
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.tls).poll_shutdown(cx)
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = Conn;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(x) => x,
            // The acceptor task is gone: nothing will ever come.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.addr)
    }
}

/// What [`get`] sends and how it authenticates.
pub struct Get<'a> {
    /// The name the server's certificate must carry.
    pub server_name: &'a str,
    /// The CA the server's certificate must chain to (PEM).
    pub ca_pem: &'a str,
    /// A client certificate and key to present (PEM).
    pub identity: Option<(&'a str, &'a str)>,
    /// A bearer token to send.
    pub token: Option<&'a str>,
    pub path: &'a str,
}

/// One HTTP/1.1 GET over TLS, as a scraper or a probe makes it: the status code and the
/// body. For the e2e tests and the agent's listener tests (a small client rather than an
/// HTTP client crate: one GET per check, no pooling, no redirects).
pub async fn get(addr: SocketAddr, req: &Get<'_>) -> Result<(u16, String), GetError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut roots = RootCertStore::empty();
    for c in pem_certs(req.ca_pem, "CA")? {
        roots.add(c).map_err(Error::Config)?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(Error::Config)?
    .with_root_certificates(roots);
    let cfg = match req.identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => builder
            .with_client_auth_cert(
                pem_certs(cert, "client certificate")?,
                PrivateKeyDer::from_pem_slice(key.as_bytes()).map_err(|e| Error::Pem {
                    what: "client key".into(),
                    detail: e.to_string(),
                })?,
            )
            .map_err(Error::Config)?,
    };
    let name = ServerName::try_from(req.server_name.to_owned())
        .map_err(|e| GetError::Name(e.to_string()))?;
    let tcp = TcpStream::connect(addr).await?;
    let mut tls = tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        tokio_rustls::TlsConnector::from(Arc::new(cfg)).connect(name, tcp),
    )
    .await
    .map_err(|_| GetError::Timeout)??;
    let auth = req
        .token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    tls.write_all(
        format!(
            "GET {} HTTP/1.1\r\nHost: {}\r\n{auth}Connection: close\r\n\r\n",
            req.path, req.server_name
        )
        .as_bytes(),
    )
    .await?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut buf))
        .await
        .map_err(|_| GetError::Timeout)??;
    let text = String::from_utf8_lossy(&buf);
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| GetError::Response(text.chars().take(200).collect()))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((code, body))
}

#[derive(Debug, thiserror::Error)]
pub enum GetError {
    #[error(transparent)]
    Tls(#[from] Error),
    #[error("server name: {0}")]
    Name(String),
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error("no answer within the timeout")]
    Timeout,
    #[error("not an HTTP response: {0:?}")]
    Response(String),
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use axum::{Router, extract::ConnectInfo, routing::get};
    use rcgen::{
        BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    };

    struct Ca {
        pem: String,
        issuer: Issuer<'static, KeyPair>,
    }

    fn new_ca() -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let pem = p.self_signed(&key).unwrap().pem();
        Ca {
            pem,
            issuer: Issuer::new(p, key),
        }
    }

    fn leaf(ca: &Ca, name: &str, usages: Vec<ExtendedKeyUsagePurpose>) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(vec![name.to_string()]).unwrap();
        p.extended_key_usages = usages;
        (
            p.signed_by(&key, &ca.issuer).unwrap().pem(),
            key.serialize_pem(),
        )
    }

    async fn serve(ca: &Ca) -> SocketAddr {
        serve_with(ca, Limits::default()).await
    }

    async fn serve_with(ca: &Ca, limits: Limits) -> SocketAddr {
        let (cert, key) = leaf(ca, "server", vec![ExtendedKeyUsagePurpose::ServerAuth]);
        let cfg = server_config(&cert, &key, Some(&ca.pem)).unwrap();
        let listener = TlsListener::bind_with(
            "127.0.0.1:0".parse().unwrap(),
            Arc::new(Fixed(cfg.into())),
            limits,
        )
        .await
        .unwrap();
        let addr = axum::serve::Listener::local_addr(&listener).unwrap();
        let app = Router::new().route(
            "/",
            get(|ConnectInfo(p): ConnectInfo<Peer>| async move {
                format!(
                    "client={} other={}",
                    p.presents("client"),
                    p.presents("other")
                )
            }),
        );
        tokio::spawn(async move {
            axum::serve(listener, app.into_make_service_with_connect_info::<Peer>()).await
        });
        addr
    }

    /// The body of GET / over TLS, presenting `identity` if given.
    async fn fetch(
        addr: SocketAddr,
        ca: &Ca,
        identity: Option<(String, String)>,
    ) -> Result<String, GetError> {
        let req = Get {
            server_name: "server",
            ca_pem: &ca.pem,
            identity: identity.as_ref().map(|(c, k)| (c.as_str(), k.as_str())),
            token: None,
            path: "/",
        };
        let (code, body) = super::get(addr, &req).await?;
        assert_eq!(code, 200);
        Ok(body)
    }

    #[tokio::test]
    async fn handlers_see_the_verified_client_name_and_nothing_else() {
        let ca = new_ca();
        let addr = serve(&ca).await;
        assert_eq!(
            fetch(addr, &ca, None).await.unwrap(),
            "client=false other=false"
        );
        let client = leaf(&ca, "client", vec![ExtendedKeyUsagePurpose::ClientAuth]);
        assert_eq!(
            fetch(addr, &ca, Some(client)).await.unwrap(),
            "client=true other=false"
        );
        // A certificate of another CA, even for the right name, fails the handshake.
        let stranger = new_ca();
        let forged = leaf(
            &stranger,
            "client",
            vec![ExtendedKeyUsagePurpose::ClientAuth],
        );
        assert!(fetch(addr, &ca, Some(forged)).await.is_err());
        // So does one of this CA that is not for client authentication.
        let server_only = leaf(&ca, "client", vec![ExtendedKeyUsagePurpose::ServerAuth]);
        assert!(fetch(addr, &ca, Some(server_only)).await.is_err());
    }

    /// Connections that never start a handshake, from 127.0.0.2: the address's share of
    /// connections fills, its next connection is closed at once, and a client of another
    /// address (kubelet's, in a pod) is served meanwhile.
    #[tokio::test]
    async fn a_silent_address_cannot_starve_another() {
        let ca = new_ca();
        let addr = serve(&ca).await;
        let from = |ip: &str| {
            let sock = tokio::net::TcpSocket::new_v4().unwrap();
            sock.bind(format!("{ip}:0").parse().unwrap()).unwrap();
            sock.connect(addr)
        };
        let mut silent = Vec::new();
        for _ in 0..MAX_CONNECTIONS_PER_IP {
            silent.push(from("127.0.0.2").await.unwrap());
        }
        // The listener accepts in order: these take the address's slots before the next.
        let mut extra = from("127.0.0.2").await.unwrap();
        let mut buf = [0u8; 1];
        let read = tokio::time::timeout(
            Duration::from_secs(2),
            tokio::io::AsyncReadExt::read(&mut extra, &mut buf),
        )
        .await;
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "the address's next connection is closed at once: {read:?}"
        );
        let started = std::time::Instant::now();
        assert_eq!(
            fetch(addr, &ca, None).await.unwrap(),
            "client=false other=false"
        );
        assert!(
            started.elapsed() < HANDSHAKE_TIMEOUT,
            "served without waiting"
        );
        drop(silent);
    }

    async fn tls_client(addr: SocketAddr, ca: &Ca) -> tokio_rustls::client::TlsStream<TcpStream> {
        let mut roots = RootCertStore::empty();
        roots
            .add(pem_certs(&ca.pem, "ca").unwrap().remove(0))
            .unwrap();
        let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let tcp = TcpStream::connect(addr).await.unwrap();
        tokio_rustls::TlsConnector::from(Arc::new(cfg))
            .connect(ServerName::try_from("server").unwrap(), tcp)
            .await
            .unwrap()
    }

    /// Whether the server closed `conn` within `within`.
    async fn closed_within(
        conn: &mut tokio_rustls::client::TlsStream<TcpStream>,
        within: Duration,
    ) -> bool {
        let mut buf = [0u8; 16];
        let read =
            tokio::time::timeout(within, tokio::io::AsyncReadExt::read(conn, &mut buf)).await;
        matches!(read, Ok(Ok(0)) | Ok(Err(_)))
    }

    /// A client that completes its handshake and then says nothing is closed once idle
    /// for the limit, and its share of the address's connections comes back.
    #[tokio::test]
    async fn an_idle_connection_is_closed() {
        let ca = new_ca();
        let limits = Limits {
            connections: 8,
            per_ip: 1,
            idle: Duration::from_millis(500),
            max_age: Duration::from_secs(60),
        };
        let addr = serve_with(&ca, limits).await;
        let mut idle = tls_client(addr, &ca).await;
        let started = std::time::Instant::now();
        assert!(closed_within(&mut idle, Duration::from_secs(5)).await);
        assert!(started.elapsed() >= Duration::from_millis(400));
        // The slot comes back when the server drops the connection, just after the
        // client saw it close: asked again until it is, within a deadline.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let body = loop {
            match fetch(addr, &ca, None).await {
                Ok(body) => break body,
                Err(e) if std::time::Instant::now() < deadline => {
                    let _ = e;
                    tokio::task::yield_now().await;
                }
                Err(e) => panic!("the address's slot never came back: {e}"),
            }
        };
        assert_eq!(body, "client=false other=false");
    }

    /// One that trickles a byte of a request now and then is never idle, and is closed
    /// at its maximum age.
    #[tokio::test]
    async fn a_trickling_connection_is_closed_at_its_age() {
        let ca = new_ca();
        let limits = Limits {
            connections: 8,
            per_ip: 2,
            idle: Duration::from_millis(400),
            max_age: Duration::from_millis(1500),
        };
        let addr = serve_with(&ca, limits).await;
        let mut slow = tls_client(addr, &ca).await;
        let started = std::time::Instant::now();
        let mut closed = false;
        for b in b"GET / HTTP/1.1\r\nX-Slow: "
            .iter()
            .chain([b'a'; 64].iter())
        {
            if tokio::io::AsyncWriteExt::write_all(&mut slow, &[*b])
                .await
                .is_err()
            {
                closed = true;
                break;
            }
            if closed_within(&mut slow, Duration::from_millis(150)).await {
                closed = true;
                break;
            }
        }
        assert!(closed, "still open after {:?}", started.elapsed());
        let t = started.elapsed();
        assert!(
            t >= Duration::from_millis(1300) && t < Duration::from_secs(4),
            "closed after {t:?}, not at its age"
        );
    }

    #[test]
    fn a_rotated_secret_is_served_from_the_next_connection_and_a_broken_one_is_not() {
        let dir = std::env::temp_dir().join(format!("rw-https-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |ca: &Ca| {
            let (cert, key) = leaf(ca, "server", vec![ExtendedKeyUsagePurpose::ServerAuth]);
            std::fs::write(dir.join("tls.crt"), cert).unwrap();
            std::fs::write(dir.join("tls.key"), key).unwrap();
            std::fs::write(dir.join("ca.crt"), &ca.pem).unwrap();
        };
        let src = SecretDir::new(&dir);
        write(&new_ca());
        let first = src.current().unwrap();
        assert!(
            Arc::ptr_eq(&first, &src.current().unwrap()),
            "cached while unchanged"
        );
        std::thread::sleep(Duration::from_millis(20));
        write(&new_ca());
        assert!(
            !Arc::ptr_eq(&first, &src.current().unwrap()),
            "rebuilt after a change"
        );
        let good = src.current().unwrap();
        std::thread::sleep(Duration::from_millis(20));
        std::fs::write(dir.join("tls.key"), "garbage").unwrap();
        assert!(
            Arc::ptr_eq(&good, &src.current().unwrap()),
            "a broken key leaves the last good configuration in service"
        );
        // Only a first build may fail.
        assert!(SecretDir::new(&dir).current().is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
