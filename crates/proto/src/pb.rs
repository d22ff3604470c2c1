//! `topology.claims.v1`: the messages (re-exported from the core, `topology_claims::pb`) and the
//! tonic service stubs generated against them (features `client` and `server`).
#![allow(clippy::all, missing_docs)]

pub use topology_claims::pb::*;

// Services only: with neither feature there is nothing to include.
#[cfg(any(feature = "client", feature = "server"))]
include!(concat!(env!("OUT_DIR"), "/topology.claims.v1.rs"));

/// `topology.claims.admin.v1`: the administrative contract's messages and service stubs.
pub mod admin {
    #![allow(clippy::all, missing_docs)]

    pub use topology_claims::pb::admin::*;

    #[cfg(any(feature = "client", feature = "server"))]
    include!(concat!(
        env!("OUT_DIR"),
        "/admin/topology.claims.admin.v1.rs"
    ));

    /// The encoded file descriptor set, for server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/admin_descriptor.bin"));
}

/// The encoded file descriptor set, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/claims_descriptor.bin"));
