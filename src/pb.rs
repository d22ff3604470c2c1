//! The generated protobuf types and tonic client / server of `topology.claims.v1`: the public
//! contract, shared by the API layer (`grpc/`) and the stored lease payload (`codec`).
#![allow(clippy::all, missing_docs)]

tonic::include_proto!("topology.claims.v1");

/// `topology.claims.admin.v1`: the administrative contract (`grpc::admin`).
pub mod admin {
    #![allow(clippy::all, missing_docs)]
    include!(concat!(
        env!("OUT_DIR"),
        "/admin/topology.claims.admin.v1.rs"
    ));

    /// The encoded file descriptor set, for server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("admin_descriptor");
}

/// The encoded file descriptor set, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("claims_descriptor");
