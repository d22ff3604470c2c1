//! Prometheus series of the two sidecars, the reconciler and the verifier (feature `metrics`, off
//! by default: a cell that does not export them links no Prometheus). The binary serves these
//! registries on `--metrics-listen` with the server crate's endpoint; names, labels and help
//! texts are owned here, beside the reports they count, so `deploy/prometheus/alerts.yml` and
//! `docs/operations.md` can trust them.

use std::time::{SystemTime, UNIX_EPOCH};

use prometheus::core::Collector;
use prometheus::{GaugeVec, IntCounterVec, IntGaugeVec, Opts, Registry};
use topology_claims::error::ClaimsError;

/// Registers `collector` in `registry`; names are constants of this module, so a clash is a bug
/// the first test catches.
fn registered<C: Collector + Clone + 'static>(registry: &Registry, collector: C) -> C {
    let result = registry.register(Box::new(collector.clone()));
    result.expect("sidecar metric names are unique");
    collector
}

fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let vec = IntCounterVec::new(Opts::new(name, help), labels);
    registered(registry, vec.expect("a valid sidecar counter"))
}

fn gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    let vec = GaugeVec::new(Opts::new(name, help), labels);
    registered(registry, vec.expect("a valid sidecar gauge"))
}

/// `topology_claims_build_info{version}` 1, as the server exports it.
fn build_info(registry: &Registry) {
    let opts = Opts::new(
        "topology_claims_build_info",
        "Always 1; the version of the running binary as a label.",
    );
    let info = IntGaugeVec::new(opts, &["version"]).expect("a valid build_info gauge");
    registered(registry, info)
        .with_label_values(&[env!("CARGO_PKG_VERSION")])
        .set(1);
}

/// The unix time now, in seconds.
fn unix_now() -> f64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH);
    since.map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// The `reconcile` sidecar's series.
#[derive(Clone)]
pub struct ReconcileMetrics {
    registry: Registry,
    passes: IntCounterVec,
    leases: IntCounterVec,
    errors: IntCounterVec,
    last_success: GaugeVec,
}

impl ReconcileMetrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        build_info(&registry);
        Self {
            passes: counter_vec(
                &registry,
                "topology_claims_reconcile_passes_total",
                "Reconcile passes, by result (ok, error).",
                &["cell_id", "result"],
            ),
            leases: counter_vec(
                &registry,
                "topology_claims_reconcile_leases_total",
                "Leases the reconciler ended, by outcome (committed, rolled_back).",
                &["cell_id", "outcome"],
            ),
            errors: counter_vec(
                &registry,
                "topology_claims_reconcile_errors_total",
                "Errors inside reconcile passes (leases that could not be ended, failed passes).",
                &["cell_id"],
            ),
            last_success: gauge_vec(
                &registry,
                "topology_claims_reconcile_last_success_timestamp_seconds",
                "Unix time of the last reconcile pass that succeeded.",
                &["cell_id"],
            ),
            registry,
        }
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Records one pass.
    pub fn observe(&self, cell_id: &str, pass: &Result<crate::ReconcileReport, ClaimsError>) {
        match pass {
            Ok(report) => {
                self.passes.with_label_values(&[cell_id, "ok"]).inc();
                self.leases
                    .with_label_values(&[cell_id, "committed"])
                    .inc_by(report.committed);
                self.leases
                    .with_label_values(&[cell_id, "rolled_back"])
                    .inc_by(report.rolled_back);
                self.errors
                    .with_label_values(&[cell_id])
                    .inc_by(report.errors);
                self.last_success
                    .with_label_values(&[cell_id])
                    .set(unix_now());
            }
            Err(_) => {
                self.passes.with_label_values(&[cell_id, "error"]).inc();
                self.errors.with_label_values(&[cell_id]).inc();
            }
        }
    }

    /// Makes the series of `cell_id` appear (at zero) before the first pass ends.
    pub fn init(&self, cell_id: &str) {
        for result in ["ok", "error"] {
            self.passes.with_label_values(&[cell_id, result]);
        }
        for outcome in ["committed", "rolled_back"] {
            self.leases.with_label_values(&[cell_id, outcome]);
        }
        self.errors.with_label_values(&[cell_id]);
    }
}

impl Default for ReconcileMetrics {
    fn default() -> Self {
        Self::new()
    }
}

/// The `verify` sidecar's series.
#[derive(Clone)]
pub struct VerifyMetrics {
    registry: Registry,
    records_checked: IntCounterVec,
    discrepancies: IntCounterVec,
    corrections: IntCounterVec,
    runs: IntCounterVec,
    last_completed: GaugeVec,
}

/// The discrepancy kinds of the verifier's report.
pub const DISCREPANCY_KINDS: [&str; 3] = ["missing", "different", "extra"];

impl VerifyMetrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        build_info(&registry);
        Self {
            records_checked: counter_vec(
                &registry,
                "topology_claims_verify_records_checked_total",
                "Cell records the verifier compared with the service.",
                &["cell_id"],
            ),
            discrepancies: counter_vec(
                &registry,
                "topology_claims_verify_discrepancies_total",
                "Differences found, by kind (missing, different, extra).",
                &["cell_id", "kind"],
            ),
            corrections: counter_vec(
                &registry,
                "topology_claims_verify_corrections_total",
                "Corrections applied, by result (applied, failed).",
                &["cell_id", "result"],
            ),
            runs: counter_vec(
                &registry,
                "topology_claims_verify_runs_total",
                "Verify runs, by result (complete, partial, error).",
                &["cell_id", "result"],
            ),
            last_completed: gauge_vec(
                &registry,
                "topology_claims_verify_last_completed_timestamp_seconds",
                "Unix time of the last verify run that went through every table.",
                &["cell_id"],
            ),
            registry,
        }
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Makes the series of `cell_id` appear (at zero) before the first run ends.
    pub fn init(&self, cell_id: &str) {
        self.records_checked.with_label_values(&[cell_id]);
        for kind in DISCREPANCY_KINDS {
            self.discrepancies.with_label_values(&[cell_id, kind]);
        }
        for result in ["applied", "failed"] {
            self.corrections.with_label_values(&[cell_id, result]);
        }
    }

    /// Records the progress of the current run: `report` is cumulative over the run and
    /// `before` what was already recorded of it (start a run with the default report).
    pub fn progress(
        &self,
        cell_id: &str,
        before: &crate::VerifyReport,
        report: &crate::VerifyReport,
    ) {
        let add = |c: &IntCounterVec, labels: &[&str], now: u64, was: u64| {
            c.with_label_values(labels).inc_by(now.saturating_sub(was));
        };
        add(
            &self.records_checked,
            &[cell_id],
            report.records_checked,
            before.records_checked,
        );
        add(
            &self.discrepancies,
            &[cell_id, "missing"],
            report.missing,
            before.missing,
        );
        add(
            &self.discrepancies,
            &[cell_id, "different"],
            report.different,
            before.different,
        );
        add(
            &self.discrepancies,
            &[cell_id, "extra"],
            report.extra,
            before.extra,
        );
        add(
            &self.corrections,
            &[cell_id, "applied"],
            report.corrections_applied,
            before.corrections_applied,
        );
        add(
            &self.corrections,
            &[cell_id, "failed"],
            report.corrections_failed,
            before.corrections_failed,
        );
    }

    /// Records the end of a run.
    pub fn finished(&self, cell_id: &str, run: &Result<crate::VerifyReport, ClaimsError>) {
        let result = match run {
            Ok(report) if report.finished => {
                self.last_completed
                    .with_label_values(&[cell_id])
                    .set(unix_now());
                "complete"
            }
            Ok(_) => "partial",
            Err(_) => "error",
        };
        self.runs.with_label_values(&[cell_id, result]).inc();
    }
}

impl Default for VerifyMetrics {
    fn default() -> Self {
        Self::new()
    }
}
