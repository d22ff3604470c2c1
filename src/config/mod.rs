//! Configuration as data, shared by the product binary and the tools: the store URL schemes
//! ([`StoreUrl`]) and durations on the command line ([`duration`]). Pure parsing and printing;
//! opening a store is the binary's job (it links the backends, this crate cannot).

pub mod duration;
mod store_url;

pub use duration::{format_duration, parse_duration, parse_nonzero_duration};
pub use store_url::{redact_url, StoreUrl, SUPPORTED_STORES};
