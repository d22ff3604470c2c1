//! # topology-claims-proto
//!
//! The wire layer of topology-claims, shared by the client and the server:
//!
//! - [`pb`]: the protobuf messages (generated in the core, `topology_claims::pb`) and the tonic
//!   service stubs generated against them. Feature `client` selects the client stubs, `server`
//!   the server traits;
//! - [`convert`]: protobuf ↔ domain, one function per message, refusing what does not decode with
//!   `INVALID_ARGUMENT` naming the field;
//! - [`status`]: the one mapping between [`ClaimsError`](topology_claims::ClaimsError) and gRPC
//!   statuses (with `google.rpc.ErrorInfo`), both ways;
//! - [`page_token`]: the opaque position of a claims listing.
//!
//! No protocol rule lives here: every decision is `topology_claims::domain`'s.

pub mod convert;
pub mod log;
pub mod namespaces;
pub mod page_token;
pub mod pb;
pub mod status;
