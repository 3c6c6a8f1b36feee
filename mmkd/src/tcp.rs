//! mmkd's TCP listeners (the gRPC API with `--listen`, the metrics server): connections
//! accepted under limits, TLS done here, and a client that does not start speaking in
//! time dropped.
//!
//! - **Limits.** At most [`Limits::per_peer`] connections from one address and
//!   [`Limits::total`] in all; one more is closed at once. So a local user with 20,000
//!   idle connections cannot take the file descriptors that the Unix socket, the MPS
//!   daemons and the jobs' pipes need (mmkd also raises its own descriptor limit at start,
//!   [`raise_fd_limit`], and sizes these limits from it).
//! - **Time to speak.** The TLS handshake and then the client's first bytes (for gRPC the
//!   HTTP/2 preface) must each come within [`FIRST_BYTES`]; a connection that finished the
//!   handshake and says nothing is dropped, as is one that never shakes hands. Once HTTP/2
//!   runs, its keepalive pings drop a peer that stops answering.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use rustls_pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tracing::{debug, warn};

/// How long a client has for the TLS handshake, and then for its first bytes.
pub const FIRST_BYTES: Duration = Duration::from_secs(10);

/// What every HTTP/2 client sends first (RFC 9113, 3.4).
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// How many connections a listener keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub per_peer: usize,
    pub total: usize,
}

/// What a connection must send first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opening {
    /// The HTTP/2 preface (gRPC).
    Http2,
    /// Any byte (HTTP/1.1 or HTTP/2).
    Any,
}

/// Who is on the other end of a connection: its address, and the certificate chain TLS
/// verified (`None` without TLS). mmkd's API reads the caller from the leaf.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    pub remote: SocketAddr,
    pub certs: Option<Arc<Vec<CertificateDer<'static>>>>,
}

/// An accepted connection, its opening bytes read and kept for the server.
#[derive(Debug)]
pub struct Conn {
    io: Io,
    /// Bytes read to check the opening, handed back before the stream's own.
    head: Vec<u8>,
    at: usize,
    info: ConnInfo,
    _permit: Permit,
}

#[derive(Debug)]
enum Io {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl Conn {
    pub fn info(&self) -> &ConnInfo {
        &self.info
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.at < this.head.len() {
            let n = (this.head.len() - this.at).min(buf.remaining());
            buf.put_slice(&this.head[this.at..this.at + n]);
            this.at += n;
            return Poll::Ready(Ok(()));
        }
        match &mut this.io {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_write(cx, data),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, data),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }
}

/// The connections open now, by peer address.
#[derive(Debug)]
struct Open {
    limits: Limits,
    by_peer: Mutex<HashMap<IpAddr, usize>>,
}

/// One connection's place under the limits, given back when the connection closes.
#[derive(Debug)]
struct Permit {
    open: Arc<Open>,
    peer: IpAddr,
}

impl Open {
    fn admit(self: &Arc<Open>, peer: IpAddr) -> Option<Permit> {
        let mut by_peer = self.by_peer.lock().unwrap_or_else(PoisonError::into_inner);
        let total: usize = by_peer.values().sum();
        let mine = by_peer.get(&peer).copied().unwrap_or(0);
        if mine >= self.limits.per_peer || total >= self.limits.total {
            return None;
        }
        *by_peer.entry(peer).or_default() += 1;
        Some(Permit {
            open: Arc::clone(self),
            peer,
        })
    }

    fn count(&self) -> usize {
        self.by_peer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .sum()
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut by_peer = self
            .open
            .by_peer
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = by_peer.get_mut(&self.peer) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                by_peer.remove(&self.peer);
            }
        }
    }
}

/// Accepts connections on `listener` until the receiver is dropped, under `limits`; with
/// `tls`, shakes hands; reads the `opening`; yields the connections that passed. What
/// fails is closed and logged at debug level (a refusal for the limits at warn, at most
/// once a minute).
pub fn incoming(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    limits: Limits,
    opening: Opening,
    name: &'static str,
) -> mpsc::Receiver<io::Result<Conn>> {
    incoming_within(listener, tls, limits, opening, name, FIRST_BYTES)
}

/// [`incoming`], with `first_bytes` for [`FIRST_BYTES`].
fn incoming_within(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    limits: Limits,
    opening: Opening,
    name: &'static str,
    first_bytes: Duration,
) -> mpsc::Receiver<io::Result<Conn>> {
    let (tx, rx) = mpsc::channel(64);
    let open = Arc::new(Open {
        limits,
        by_peer: Mutex::default(),
    });
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    tokio::spawn(async move {
        let mut last_warned: Option<tokio::time::Instant> = None;
        loop {
            let (tcp, peer) = tokio::select! {
                () = tx.closed() => return,
                accepted = listener.accept() => match accepted {
                    Ok(c) => c,
                    Err(e) => {
                        // Out of descriptors, most likely: wait a moment rather than spin.
                        warn!(listener = name, error = %e, "cannot accept a connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let Some(permit) = open.admit(peer.ip()) else {
                if last_warned.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
                    warn!(
                        listener = name,
                        %peer,
                        open = open.count(),
                        per_peer = limits.per_peer,
                        total = limits.total,
                        "connection limit reached: closing new connections"
                    );
                    last_warned = Some(tokio::time::Instant::now());
                }
                drop(tcp);
                continue;
            };
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(first_bytes, handshake(tcp, peer, acceptor, opening))
                    .await
                {
                    Ok(Ok((io, head, certs))) => {
                        let conn = Conn {
                            io,
                            head,
                            at: 0,
                            info: ConnInfo {
                                remote: peer,
                                certs,
                            },
                            _permit: permit,
                        };
                        let _ = tx.send(Ok(conn)).await;
                    }
                    Ok(Err(e)) => debug!(listener = name, %peer, error = %e, "connection dropped"),
                    Err(_) => debug!(
                        listener = name,
                        %peer,
                        "connection dropped: nothing said in {first_bytes:?}"
                    ),
                }
            });
        }
    });
    rx
}

type Handshaken = (Io, Vec<u8>, Option<Arc<Vec<CertificateDer<'static>>>>);

async fn handshake(
    tcp: TcpStream,
    peer: SocketAddr,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    opening: Opening,
) -> io::Result<Handshaken> {
    let _ = tcp.set_nodelay(true);
    let (mut io, certs) = match acceptor {
        Some(a) => {
            let tls = a.accept(tcp).await?;
            let certs = tls
                .get_ref()
                .1
                .peer_certificates()
                .map(|c| Arc::new(c.iter().map(|c| c.clone().into_owned()).collect()));
            (Io::Tls(Box::new(tls)), certs)
        }
        None => (Io::Plain(tcp), None),
    };
    let want = match opening {
        Opening::Http2 => H2_PREFACE.len(),
        Opening::Any => 1,
    };
    let mut head = vec![0u8; want];
    let mut got = 0;
    while got < want {
        let n = match &mut io {
            Io::Plain(s) => s.read(&mut head[got..]).await?,
            Io::Tls(s) => s.read(&mut head[got..]).await?,
        };
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{peer} closed before it spoke"),
            ));
        }
        got += n;
    }
    if opening == Opening::Http2 && head != H2_PREFACE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{peer} does not speak HTTP/2"),
        ));
    }
    Ok((io, head, certs))
}

/// The TLS of mmkd's TCP listeners: its certificate and key, and the client CA whose
/// certificates it takes (`--tls-cert`, `--tls-key`, `--tls-client-ca`); `alpn`: the
/// protocols offered (`h2` for gRPC).
pub fn server_config(files: &TlsFiles, alpn: &[&[u8]]) -> anyhow::Result<rustls::ServerConfig> {
    use anyhow::Context as _;
    use rustls_pki_types::PrivateKeyDer;
    use rustls_pki_types::pem::PemObject as _;
    let certs = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("the TLS certificate {}", files.cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .with_context(|| format!("the TLS key {}", files.key.display()))?;
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_file_iter(&files.client_ca)
        .with_context(|| format!("the client CA {}", files.client_ca.display()))?
    {
        roots
            .add(ca.with_context(|| format!("the client CA {}", files.client_ca.display()))?)
            .with_context(|| format!("the client CA {}", files.client_ca.display()))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .context("the client CA")?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .context("the TLS certificate and key")?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// Raises this process's open-file limit to its hard limit; returns the soft limit now
/// (what the TCP listeners' limits are sized from).
pub fn raise_fd_limit() -> u64 {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if let Some(hard) = limit.maximum
        && limit.current.is_some_and(|soft| soft < hard)
    {
        limit.current = Some(hard);
        if let Err(e) = setrlimit(Resource::Nofile, limit) {
            warn!(error = %e, "cannot raise the open-file limit");
        }
    }
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// The API's TCP limits for a process that may open `fds` files: a quarter of them for
/// TCP clients (the rest stay for the Unix socket, the MPS daemons, the jobs and the
/// store), at most 64 from one address.
pub fn api_limits(fds: u64) -> Limits {
    let total = usize::try_from(fds / 4)
        .unwrap_or(usize::MAX)
        .clamp(16, 16_384);
    Limits {
        per_peer: 64.min(total),
        total,
    }
}

/// The metrics server's limits: a few scrapers.
pub const METRICS_LIMITS: Limits = Limits {
    per_peer: 8,
    total: 64,
};

/// The files of the TCP listener's mutual TLS.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
    pub client_ca: std::path::PathBuf,
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt as _;

    #[test]
    fn limits_follow_the_descriptors() {
        assert_eq!(
            api_limits(1024),
            Limits {
                per_peer: 64,
                total: 256
            }
        );
        assert_eq!(api_limits(20).total, 16);
        assert_eq!(api_limits(u64::MAX).total, 16_384);
    }

    #[tokio::test]
    async fn connections_past_the_limits_are_closed_and_silent_ones_dropped() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let limits = Limits {
            per_peer: 2,
            total: 3,
        };
        let quiet = Duration::from_millis(300);
        let mut conns = incoming_within(l, None, limits, Opening::Http2, "test", quiet);
        // Two that speak HTTP/2 get through, with their preface handed back.
        let mut a = TcpStream::connect(addr).await.unwrap();
        a.write_all(H2_PREFACE).await.unwrap();
        let mut got = conns.recv().await.unwrap().unwrap();
        let mut head = [0u8; 24];
        got.read_exact(&mut head).await.unwrap();
        assert_eq!(&head, H2_PREFACE);
        assert_eq!(got.info().remote.ip(), a.local_addr().unwrap().ip());
        let mut b = TcpStream::connect(addr).await.unwrap();
        b.write_all(H2_PREFACE).await.unwrap();
        let _b_conn = conns.recv().await.unwrap().unwrap();
        // A third from the same address is closed at once.
        let mut c = TcpStream::connect(addr).await.unwrap();
        let mut buf = [0u8; 1];
        assert!(matches!(c.read(&mut buf).await, Ok(0) | Err(_)));
        drop(got);
        // One that does not speak HTTP/2 is dropped; one that says nothing is dropped
        // once its time is up.
        let mut d = TcpStream::connect(addr).await.unwrap();
        d.write_all(b"GET / HTTP/1.1\r\n\r\n......").await.unwrap();
        assert!(matches!(d.read(&mut buf).await, Ok(0) | Err(_)));
        let mut silent = loop {
            let mut s = TcpStream::connect(addr).await.unwrap();
            // Refused while the dropped one's place is still being given back.
            match tokio::time::timeout(Duration::from_millis(100), s.read(&mut buf)).await {
                Err(_) => break s,
                Ok(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        assert!(matches!(silent.read(&mut buf).await, Ok(0) | Err(_)));
        // Places come back: a new one that speaks gets through.
        let began = std::time::Instant::now();
        loop {
            let mut e = TcpStream::connect(addr).await.unwrap();
            e.write_all(H2_PREFACE).await.unwrap();
            if let Ok(Some(Ok(_))) =
                tokio::time::timeout(Duration::from_millis(200), conns.recv()).await
            {
                break;
            }
            assert!(
                began.elapsed() < Duration::from_secs(30),
                "no place came back"
            );
        }
    }
}
