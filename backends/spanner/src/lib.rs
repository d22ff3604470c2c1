//! # topology-claims-spanner
//!
//! The Cloud Spanner adapter of `topology-claims`: [`SpannerClaimStore`], the service's
//! [`ClaimStore`](topology_claims::ClaimStore) on one Spanner database (the
//! `spanner://projects/P/instances/I/databases/D` store of `topology-claims serve`), and
//! [`migrate`], which applies the schema (and with `create_database` creates the database,
//! and on the emulator its instance).
//!
//! The crate does I/O only. Every protocol rule lives in `topology_claims::domain`: each write
//! is one read-write transaction that reads the rows a request touches, asks the domain, and
//! buffers exactly the mutations it decided (the twin of `topology_claims::domain::Tables`).
//! Time is Spanner's: every timestamp written is the commit timestamp, or, where the domain
//! decides with the clock (verification slot expiry, restore epochs), `CURRENT_TIMESTAMP()` of
//! the transaction; `server_time` is the read timestamp of a strong snapshot.
//! docs/backends/spanner.md has the schema, the indexes, the IAM roles and the emulator recipe.
//!
//! Modules: `config` (URL, options, client settings), `schema` (DDL migrations), `rows`
//! (rows ↔ domain, mutations), `transaction` (the abort-retry loop), `store` (the port),
//! `group` (group commit), `outcomes` (outcome collection), `restore` (restore epochs and
//! verification pass reports), `watch` (the change feed's events, written by every write
//! transaction; reading and compacting them), `error` (failure classification).

mod config;
mod error;
mod group;
mod namespaces;
mod outcomes;
mod restore;
mod rows;
mod schema;
mod store;
mod transaction;
mod wait_line;
mod watch;

pub use config::{
    DatabaseName, SpannerOptions, DEFAULT_RPC_TIMEOUT, DEFAULT_SESSION_POOL_SIZE,
    DEFAULT_TRANSACTION_DEADLINE, EMULATOR_HOST_ENV, URL_SCHEME,
};
pub use schema::{migrate, migrate_through};
pub use store::SpannerClaimStore;
