//! The thin gRPC front end: proto <-> domain conversion, the one error-to-status mapping, and the
//! tonic service that decodes, calls the store, encodes. No protocol rules and no SQL live here.

pub mod admin;
pub mod audit;
pub mod authz;
pub mod cell_limits;
pub mod convert;
pub mod decode;
pub mod guard;
pub mod health;
pub mod limits;
pub mod listener;
pub mod metrics;
pub mod page_token;
pub mod responses;
pub mod server;
pub mod service;
pub mod status;
pub mod tls;

/// The generated protobuf types and tonic client/server of `topology.claims.v1`.
pub use crate::pb;

pub use service::{ClaimsServiceImpl, ServiceConfig};
