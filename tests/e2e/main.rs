//! End-to-end tests: real gRPC over TCP to the in-process server (`testing::TestServer`), over
//! the in-memory store and over SQLite on a temp file. Everything is checked from a client's
//! view: status codes, the google.rpc.ErrorInfo reason and metadata, BadRequest field
//! violations, and what LookupClaim / ListClaims / ListOutstandingLeases answer afterwards.
//!
//! One test binary (one link), one module per behaviour. Most cases take the store as an
//! argument and run once per store through `against_every_store!`, as
//! `<module>::memory::<case>` and `<module>::sqlite::<case>`.

mod support;

mod begin;
mod end;
mod lists;
mod page_tokens;
mod race;
mod renew;
mod scenarios;
mod server;
mod stream;
mod validation;
