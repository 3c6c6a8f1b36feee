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

/// The encoded file descriptor set of `mmk.v1`, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/mmk_v1_descriptor.bin"));

/// The protobuf package name.
pub const PACKAGE: &str = "mmk.v1";
