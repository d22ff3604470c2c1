//! The open-loop part of a run (`--rate`, `--slo`): every system at every listed rate, round by
//! round in turn, then the SLO searches; the tables of both and their JSON (`open_loop`, `slo`).
//!
//! Owns the order of the open-loop segments and their report. Must not drive load itself
//! (`open_loop`) nor decide a search's next step (`slo`).

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{json, Value};

use super::open_loop::{OpenSegment, Plan};
use super::plot::RatePoint;
use super::slo::{self, SloArgs, SloResult};
use super::systems::{Conn, PgSchema, System};
use super::workload::Scenario;

/// What the open-loop part measured.
pub struct OpenResults {
    /// One per (scenario, rate, system), rounds merged, in the order measured.
    pub rates: Vec<OpenSegment>,
    pub slo: Vec<SloResult>,
    /// Segments that could not run, as in the closed loop's `failed`.
    pub failed: Vec<Value>,
}

/// The listed rates (`rounds` times each, systems in turn), then the SLO searches if `--slo`.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    systems: &mut [System],
    scenarios: &[Scenario],
    rates: &[f64],
    rounds: usize,
    duration: Duration,
    slo_args: &SloArgs,
    plan: &mut Plan,
    schemas: &[PgSchema],
) -> OpenResults {
    // Each system's connections live for the whole open-loop part, so a segment pays only for
    // the connections its rate needs beyond the previous ones (and its warm-up opens those).
    let mut pools: Vec<Vec<Conn>> = systems.iter().map(|_| Vec::new()).collect();
    let mut segments: Vec<OpenSegment> = Vec::new();
    let mut failed = Vec::new();
    for &scenario in scenarios {
        for &rate in rates {
            super::pg::vacuum_schemas(schemas).await;
            for round in 0..rounds {
                for (system, pool) in systems.iter_mut().zip(pools.iter_mut()) {
                    let spec = plan.spec(scenario, rate, duration);
                    match super::open_loop::run(system, pool, &spec).await {
                        Ok(segment) => merge(&mut segments, segment),
                        Err(error) => {
                            let label = system.label();
                            eprintln!(
                                "bench: {label} {scenario} at {rate} pairs/s round {}: {error}",
                                round + 1
                            );
                            failed.push(json!({
                                "system": label,
                                "scenario": scenario.name(),
                                "rate": rate,
                                "round": round + 1,
                                "error": error,
                            }));
                        }
                    }
                }
            }
        }
    }
    let slo = match slo_args.slo {
        Some(threshold) => {
            slo::run(
                systems, &mut pools, scenarios, slo_args, threshold, plan, schemas,
            )
            .await
        }
        None => Vec::new(),
    };
    for result in &slo {
        if let Some(error) = &result.error {
            failed.push(json!({
                "system": result.system,
                "scenario": result.scenario.name(),
                "slo_search": true,
                "error": error,
            }));
        }
    }
    OpenResults {
        rates: segments,
        slo,
        failed,
    }
}

/// Adds a round to the row of its scenario, rate and system.
fn merge(rows: &mut Vec<OpenSegment>, segment: OpenSegment) {
    match rows.iter_mut().find(|row| {
        row.system == segment.system && row.scenario == segment.scenario && row.rate == segment.rate
    }) {
        Some(row) => {
            row.tally.merge(&segment.tally);
            row.duration += segment.duration;
        }
        None => rows.push(segment),
    }
}

impl OpenResults {
    /// The systems measured, in order.
    pub fn systems(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let names = self.rates.iter().map(|s| &s.system).chain(
            self.slo
                .iter()
                .filter(|r| !r.steps.is_empty())
                .map(|r| &r.system),
        );
        for name in names {
            if !out.contains(name) {
                out.push(name.clone());
            }
        }
        out
    }

    /// What `--plot` draws: every listed rate and every search step.
    pub fn points(&self) -> Vec<RatePoint> {
        self.rates
            .iter()
            .chain(
                self.slo
                    .iter()
                    .flat_map(|r| r.steps.iter().map(|s| &s.segment)),
            )
            .map(|s| RatePoint {
                system: s.system.clone(),
                scenario: s.scenario.clone(),
                rate: s.rate,
                p999_ms: s
                    .tally
                    .tally
                    .begin
                    .ms(0.999)
                    .max(s.tally.tally.commit.ms(0.999)),
            })
            .collect()
    }

    /// The objective searched, in ms, if any.
    pub fn threshold_ms(&self) -> Option<f64> {
        self.slo.first().map(|r| r.threshold.as_secs_f64() * 1000.0)
    }

    /// `open_loop` and `slo` of the JSON document.
    pub fn add_to(&self, document: &mut Value) {
        document["systems"] = json!(self.systems());
        document["open_loop"] = json!(self
            .rates
            .iter()
            .map(OpenSegment::to_json)
            .collect::<Vec<_>>());
        document["slo"] = json!(self.slo.iter().map(SloResult::to_json).collect::<Vec<_>>());
    }

    pub fn markdown(&self) -> String {
        let mut out = String::new();
        if !self.rates.is_empty() {
            out.push_str(&rates_markdown(&self.rates));
        }
        if !self.slo.is_empty() {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(&slo::markdown(&self.slo));
        }
        out
    }
}

/// Latencies from the scheduled start at each offered rate: p50 / p99 / p99.9 / p99.95.
fn rates_markdown(rows: &[OpenSegment]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| scenario | offered pairs/s | system | done pairs/s | begin p50 / p99 / p99.9 / p99.95 | commit p50 / p99 / p99.9 / p99.95 | pair p50 / p99 / p99.9 / p99.95 | missed (late / not sent) | waited for a connection | peak in flight | not OK |"
    );
    let _ = writeln!(out, "|---|---:|---|---:|---|---|---|---:|---:|---:|---|");
    for row in rows {
        let t = &row.tally;
        let tail = |l: &super::stats::Latency| {
            format!(
                "{:.2} / {:.2} / {:.2} / {:.2} ms",
                l.ms(0.5),
                l.ms(0.99),
                l.ms(0.999),
                l.ms(0.9995)
            )
        };
        let failures = t.tally.failures();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.0} | {} | {} | {} | {} ({} / {}) | {} | {} / {} | {} |",
            row.scenario,
            super::slo::rate_label(row.rate),
            row.system,
            row.pairs_per_s(),
            tail(&t.tally.begin),
            tail(&t.tally.commit),
            tail(&t.tally.pair),
            t.missed(),
            t.late,
            t.not_sent,
            t.waited,
            t.peak_in_flight,
            row.max_in_flight,
            if failures.is_empty() {
                "–".to_owned()
            } else {
                failures.join(", ")
            },
        );
    }
    out
}
