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
    Endpoint(String),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Socket(p) => write!(f, "{}", p.display()),
            Target::Endpoint(e) => f.write_str(e),
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
            if !path.exists() {
                return Err(fail(&"no such socket"));
            }
            mmk_proto::unix_channel(path, None)
                .await
                .map_err(|e| fail(&source_chain(&e)))?
        }
        Target::Endpoint(url) => Endpoint::from_shared(url.clone())
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

/// An error with its causes, `a: b: c`.
pub(crate) fn source_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
