//! The thin gRPC front end: the tonic service that decodes, calls the store, encodes, and the
//! bounds around it (listener, guard, limits, authorization, audit). The proto <-> domain
//! conversion and the one error-to-status mapping are `topology-claims-proto`'s, re-exported
//! here. No protocol rules and no SQL live here.

pub mod admin;
pub mod audit;
pub mod authz;
pub mod cell_limits;
pub mod guard;
mod handshakes;
pub mod health;
pub mod lease_wait;
pub mod limits;
pub mod listener;
pub mod metrics;
pub mod responses;
pub mod server;
pub mod service;
pub mod tls;
pub mod watch;

/// The wire layer this front end speaks: generated types and stubs, conversions, statuses.
pub use topology_claims_proto::{convert, page_token, pb, status};

pub use service::{ClaimsServiceImpl, ServiceConfig};
