//! `mmk.v1`: generated gRPC code, conversions between protobuf and domain types, and the
//! single mapping from [`ServiceError`] to [`tonic::Status`].

#![allow(missing_debug_implementations)]

pub mod v1 {
    #![allow(clippy::all, clippy::pedantic, clippy::unwrap_used)]
    tonic::include_proto!("mmk.v1");
}

/// The kubelet's APIs, for mmkd's Kubernetes device plugin (and the fake kubelet of the
/// tests): the device-plugin API v1beta1 and pod-resources v1.
pub mod k8s {
    pub mod deviceplugin {
        pub mod v1beta1 {
            #![allow(clippy::all, clippy::pedantic, clippy::unwrap_used)]
            tonic::include_proto!("v1beta1");
        }
    }
    pub mod podresources {
        pub mod v1 {
            #![allow(clippy::all, clippy::pedantic, clippy::unwrap_used)]
            tonic::include_proto!("v1");
        }
    }
}

mod convert;
mod status;

pub use convert::{
    class_from_proto, class_to_proto, spec_from_proto, spec_to_proto, state_from_proto,
    state_to_proto, timestamp,
};
pub use prost_types::Timestamp;
pub use status::{FIELD_METADATA, service_error_to_status};

/// A gRPC channel over a Unix socket: mmkd's own, or the kubelet's and a device plugin's.
/// With `timeout`, both connecting and each call give up after it.
pub async fn unix_channel(
    path: &std::path::Path,
    timeout: Option<std::time::Duration>,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    // The URI is required but unused: the connector dials the socket.
    let mut endpoint = tonic::transport::Endpoint::from_static("http://unix.socket");
    if let Some(t) = timeout {
        endpoint = endpoint.connect_timeout(t).timeout(t);
    }
    endpoint
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                tokio::net::UnixStream::connect(path)
                    .await
                    .map(hyper_util::rt::TokioIo::new)
            }
        }))
        .await
}

/// The encoded file descriptor set of `mmk.v1`, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/mmk_v1_descriptor.bin"));

/// The protobuf package name.
pub const PACKAGE: &str = "mmk.v1";
