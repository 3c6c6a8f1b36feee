//! Connecting to mmkd over its Unix socket or a TCP endpoint.

use std::path::PathBuf;

use mmk_proto::v1::job_service_client::JobServiceClient;
use mmk_proto::v1::node_service_client::NodeServiceClient;
use mmk_proto::v1::partition_service_client::PartitionServiceClient;
use tonic::transport::{Channel, Endpoint};

use crate::cli::Failure;

/// Where mmkd is.
#[derive(Debug, Clone)]
pub enum Target {
    Socket(PathBuf),
    /// A TCP endpoint, always over TLS with a client certificate.
    Endpoint(String, TlsFiles),
}

/// The files of mmkctl's side of mutual TLS.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The CA that signed mmkd's certificate.
    pub ca: PathBuf,
    /// mmkctl's certificate: its common name is the caller's user name on mmkd's node.
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Socket(p) => write!(f, "{}", p.display()),
            Target::Endpoint(e, _) => f.write_str(e),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Clients {
    /// The connection itself, for other services (health, reflection).
    pub channel: Channel,
    pub jobs: JobServiceClient<Channel>,
    pub partitions: PartitionServiceClient<Channel>,
    pub node: NodeServiceClient<Channel>,
}

pub async fn connect(target: &Target) -> Result<Clients, Failure> {
    let fail = |e: &dyn std::fmt::Display| {
        Failure::server(format!(
            "cannot connect to mmkd at {target}: {e}; is mmkd running? (see --socket, MMK_SOCKET, --endpoint)"
        ))
    };
    let channel = match target {
        Target::Socket(path) => {
            match std::fs::metadata(path) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                    return Err(denied(path));
                }
                Err(_) => return Err(fail(&"no such socket")),
            }
            mmk_proto::unix_channel(path, None).await.map_err(|e| {
                let text = source_chain(&e);
                if text.contains("ermission denied") {
                    denied(path)
                } else {
                    fail(&text)
                }
            })?
        }
        Target::Endpoint(url, tls) => Endpoint::from_shared(url.clone())
            .map_err(|e| Failure::usage(format!("--endpoint {url:?}: {e}")))?
            .tls_config(tls_config(tls)?)
            .map_err(|e| Failure::usage(format!("--endpoint {url:?}: {e}")))?
            .connect()
            .await
            .map_err(|e| fail(&source_chain(&e)))?,
    };
    Ok(Clients {
        channel: channel.clone(),
        jobs: JobServiceClient::new(channel.clone()),
        partitions: PartitionServiceClient::new(channel.clone()),
        node: NodeServiceClient::new(channel),
    })
}

/// mmkd runs, but this user may not call it: the socket (or its folder) is for a group.
fn denied(path: &std::path::Path) -> Failure {
    use std::os::unix::fs::MetadataExt as _;
    let group = [Some(path), path.parent()]
        .into_iter()
        .flatten()
        .find_map(|p| std::fs::metadata(p).ok())
        .and_then(|m| uzers::get_group_by_gid(m.gid()))
        .map(|g| g.name().to_string_lossy().into_owned());
    let who = match group {
        Some(g) => format!(
            "members of group {g} may call it; ask the node's operator to add you \
             (usermod -aG {g} $USER), then log in again"
        ),
        None => "ask the node's operator for access to it".to_owned(),
    };
    Failure::server(format!(
        "permission denied on mmkd's socket {}: {who} (see --socket, MMK_SOCKET)",
        path.display()
    ))
}

fn tls_config(files: &TlsFiles) -> Result<tonic::transport::ClientTlsConfig, Failure> {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    // A PEM file is small: at most 1 MiB is read, whatever the path names.
    let read = |p: &PathBuf, flag: &str| {
        use std::io::Read;
        let mut buf = Vec::new();
        std::fs::File::open(p)
            .and_then(|f| f.take(1024 * 1024).read_to_end(&mut buf))
            .map_err(|e| Failure::usage(format!("{flag} {}: {e}", p.display())))?;
        Ok::<_, Failure>(buf)
    };
    Ok(ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read(&files.ca, "--tls-ca")?))
        .identity(Identity::from_pem(
            read(&files.cert, "--tls-cert")?,
            read(&files.key, "--tls-key")?,
        )))
}

/// An error with its causes, `a: b: c`.
pub(crate) use mmk_core::error::chain as source_chain;
