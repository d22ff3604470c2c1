//! # topology-claims-server
//!
//! The front end of topology-claims: the gRPC service over any
//! [`ClaimStore`](topology_claims::ClaimStore) ([`grpc`]), with its listener, limits,
//! authorization ([`auth`]), audit log, Prometheus metrics ([`metrics`]), the group-commit
//! combiner ([`group`]) and the restore-quarantine gate ([`restore`]). The binary
//! (`topology-claims serve`) wires it to a store backend.
//!
//! A cell never links this crate: it links `topology-claims-client` (decision 105).

pub mod auth;
pub mod group;
pub mod grpc;
pub mod metrics;
pub mod rest;
pub mod restore;
