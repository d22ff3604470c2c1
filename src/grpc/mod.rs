//! The thin gRPC front end: proto <-> domain conversion, the one error-to-status mapping, and the
//! tonic service that decodes, calls the store, encodes. No protocol rules and no SQL live here.

pub mod convert;
pub mod decode;
pub mod server;
pub mod service;
pub mod status;

/// The generated protobuf types and tonic client/server of `topology.claims.v1`.
pub mod pb {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("topology.claims.v1");

    /// The encoded file descriptor set, for server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("claims_descriptor");
}

pub use service::{ClaimsServiceImpl, ServiceConfig};
