//! The Cloud Spanner emulator for this crate's tests (started and stopped by the shared harness,
//! `topology_claims_harness::spanner`), and fresh stores on it.
//!
//! One emulator per test binary (a static), shared by all its tests; every store gets a fresh
//! database of its own in one instance. The binary is `TOPOLOGY_CLAIMS_SPANNER_EMULATOR` if set,
//! else the Google Cloud SDK's. Without it: with `CI=true` the tests fail; otherwise the binary
//! prints one `spanner tests skipped: <why>` line and exits successfully.
//!
//! Owns test scaffolding only; must not be used by the crate itself.

#![allow(dead_code)] // each test binary uses a different part of this module

pub mod concurrent;

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use topology_claims::MigrationPolicy;
pub use topology_claims_harness::spanner::{Emulator, Mode};
use topology_claims_spanner::{SpannerClaimStore, SpannerOptions};

pub const PROJECT: &str = "test-project";
pub const INSTANCE: &str = "test-instance";

/// Starts an emulator of the test's own (e.g. to kill it), or skips / fails without one.
pub fn start(mode: Mode) -> Emulator {
    if let Err(why) = topology_claims_harness::spanner::emulator_binary() {
        skip_or_fail(&why);
    }
    Emulator::start(mode, &std::env::temp_dir()).unwrap_or_else(|e| panic!("{e}"))
}

static SHARED: OnceLock<Emulator> = OnceLock::new();

/// The test binary's shared emulator, started on first use.
pub fn shared(mode: Mode) -> &'static Emulator {
    SHARED.get_or_init(|| start(mode))
}

/// Options for a store on `emulator`.
pub fn options(emulator: &Emulator) -> SpannerOptions {
    SpannerOptions {
        session_pool_size: 8,
        emulator_host: Some(emulator.host.clone()),
        ..SpannerOptions::default()
    }
}

/// Databases per emulator instance: the emulator refuses a 101st in one instance, and a test
/// binary that runs the suite twice (plain and through the combiner) needs more.
const DATABASES_PER_INSTANCE: u64 = 90;

/// A database name no other store of this emulator has used, in `INSTANCE`, then (after
/// `DATABASES_PER_INSTANCE` of them) in `INSTANCE-1`, `INSTANCE-2`, … (`migrate` creates the
/// instance on the emulator).
pub fn fresh_url() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let instance = match n / DATABASES_PER_INSTANCE {
        0 => INSTANCE.to_owned(),
        i => format!("{INSTANCE}-{i}"),
    };
    format!("spanner://projects/{PROJECT}/instances/{instance}/databases/db-{n}")
}

/// A fresh, empty, migrated store on the shared emulator.
pub async fn fresh_store(mode: Mode) -> SpannerClaimStore {
    let emulator = shared(mode);
    let url = fresh_url();
    let applied = topology_claims_spanner::migrate(&url, options(emulator), true)
        .await
        .unwrap_or_else(|e| panic!("creating {url}: {e}"));
    assert!(!applied.is_empty(), "a new database gets the whole schema");
    SpannerClaimStore::connect(&url, options(emulator), MigrationPolicy::Refuse)
        .await
        .unwrap_or_else(|e| panic!("connecting to {url}: {e}"))
}

/// Without an emulator: fail under CI, else say so once and end the test binary successfully.
fn skip_or_fail(why: &str) -> ! {
    if topology_claims_harness::in_ci() {
        panic!("the Spanner tests need the emulator under CI: {why}");
    }
    // Straight to the file descriptor: libtest captures print!/eprint! of passing tests.
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(stderr, "spanner tests skipped: {why}");
    let _ = stderr.flush();
    std::process::exit(0);
}
