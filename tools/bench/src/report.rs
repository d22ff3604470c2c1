//! Turns measured segments into results: one row per (scenario, clients, system) over all
//! rounds, the ratios of each service row to each baseline row of the same run, the batch sizes
//! the server's combiner formed, the JSON document (`--json`) and the Markdown tables printed to
//! stdout.
//!
//! Owns aggregation and formatting only.

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{json, Value};

use super::group_sizes::GroupSizes;
use super::stats::{median, per_second, Cpu, Segment, Tally};

/// All rounds of one system at one scenario and client count.
pub struct Row {
    pub scenario: String,
    pub clients: usize,
    pub system: String,
    pub baseline: bool,
    pub on_postgres: bool,
    pub tally: Tally,
    pub elapsed: Duration,
    pub cpu: Cpu,
    pub server_rss_kib: Option<u64>,
    /// pairs/s of each round, in round order.
    pub rounds: Vec<f64>,
    /// The combiner's groups over all rounds (`None`: the server does not export them).
    pub groups: Option<GroupSizes>,
}

impl Row {
    pub fn pairs_per_s(&self) -> f64 {
        per_second(self.tally.pairs, self.elapsed)
    }

    pub fn claims_per_s(&self) -> f64 {
        per_second(self.tally.claims, self.elapsed)
    }

    fn to_json(&self) -> Value {
        json!({
            "scenario": self.scenario,
            "clients": self.clients,
            "system": self.system,
            "baseline": self.baseline,
            "rounds": self.rounds.len(),
            "seconds": self.elapsed.as_secs_f64(),
            "pairs": self.tally.pairs,
            "claims": self.tally.claims,
            "pairs_per_s": self.pairs_per_s(),
            "claims_per_s": self.claims_per_s(),
            "pairs_per_s_by_round": self.rounds,
            "latency": {
                "begin": self.tally.begin.to_json(),
                "commit": self.tally.commit.to_json(),
                "pair": self.tally.pair.to_json(),
            },
            "outcomes": self.tally.outcomes,
            "cpu": self.cpu.to_json(self.tally.pairs),
            "server_rss_kib_max": self.server_rss_kib,
            "group_commit": self.groups.as_ref().map(GroupSizes::to_json),
        })
    }
}

/// What a system is measured against.
pub struct Ratio {
    pub scenario: String,
    pub clients: usize,
    pub system: String,
    pub baseline: String,
    /// Aggregate pairs/s over aggregate pairs/s.
    pub ratio: f64,
    /// The median of the per-round ratios (rounds ran back to back, so drift cancels).
    pub median_round_ratio: f64,
}

/// Groups segments into rows, in the order the systems first ran.
pub fn rows(segments: &[Segment], baselines: &[String], on_postgres: &[String]) -> Vec<Row> {
    let mut rows: Vec<Row> = Vec::new();
    for segment in segments {
        let position = rows.iter().position(|row| {
            row.scenario == segment.scenario
                && row.clients == segment.clients
                && row.system == segment.system
        });
        let row = match position {
            Some(i) => &mut rows[i],
            None => {
                rows.push(Row {
                    scenario: segment.scenario.clone(),
                    clients: segment.clients,
                    system: segment.system.clone(),
                    baseline: baselines.contains(&segment.system),
                    on_postgres: on_postgres.contains(&segment.system),
                    tally: Tally::default(),
                    elapsed: Duration::ZERO,
                    cpu: Cpu::default(),
                    server_rss_kib: None,
                    rounds: Vec::new(),
                    groups: None,
                });
                let last = rows.len() - 1;
                &mut rows[last]
            }
        };
        row.tally.merge(&segment.tally);
        row.elapsed += segment.elapsed;
        row.cpu.add(&segment.cpu);
        row.server_rss_kib = row.server_rss_kib.max(segment.server_rss_kib);
        row.rounds.push(segment.pairs_per_s());
        if let Some(groups) = &segment.groups {
            row.groups
                .get_or_insert_with(GroupSizes::default)
                .add(groups);
        }
    }
    rows
}

/// Each service row against each baseline row of the same scenario and client count (raw-SQL
/// baselines only against services on PostgreSQL, where the comparison means something).
pub fn ratios(rows: &[Row]) -> Vec<Ratio> {
    let mut out = Vec::new();
    for system in rows.iter().filter(|row| !row.baseline) {
        for baseline in rows.iter().filter(|row| {
            row.baseline
                && row.scenario == system.scenario
                && row.clients == system.clients
                && (system.on_postgres || !row.on_postgres)
        }) {
            let per_round: Vec<f64> = system
                .rounds
                .iter()
                .zip(&baseline.rounds)
                .filter(|(_, b)| **b > 0.0)
                .map(|(s, b)| s / b)
                .collect();
            out.push(Ratio {
                scenario: system.scenario.clone(),
                clients: system.clients,
                system: system.system.clone(),
                baseline: baseline.system.clone(),
                ratio: if baseline.pairs_per_s() > 0.0 {
                    system.pairs_per_s() / baseline.pairs_per_s()
                } else {
                    0.0
                },
                median_round_ratio: median(&per_round),
            });
        }
    }
    out
}

pub fn document(
    config: Value,
    skipped: &[(String, String)],
    failed: &[Value],
    rows: &[Row],
    ratios: &[Ratio],
    scale: &[Value],
) -> Value {
    json!({
        "tool": "topology-claims-bench",
        "version": env!("CARGO_PKG_VERSION"),
        "config": config,
        "machine": {
            "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        },
        "systems": unique(rows.iter().map(|row| row.system.clone())),
        "skipped": skipped.iter().map(|(system, why)| json!({"system": system, "why": why})).collect::<Vec<_>>(),
        "failed": failed,
        "results": rows.iter().map(Row::to_json).collect::<Vec<_>>(),
        "ratios": ratios.iter().map(|r| json!({
            "scenario": r.scenario,
            "clients": r.clients,
            "system": r.system,
            "baseline": r.baseline,
            "ratio": r.ratio,
            "median_round_ratio": r.median_round_ratio,
        })).collect::<Vec<_>>(),
        "scale": scale,
    })
}

fn unique(items: impl Iterator<Item = String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for item in items {
        if !out.contains(&item) {
            out.push(item);
        }
    }
    out
}

/// The Markdown tables of a run (also what `docs/benchmarks.md` shows).
pub fn markdown(rows: &[Row], ratios: &[Ratio], scale: &[Value]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| scenario | clients | system | pairs/s | claims/s | pair p50 | pair p99 | pair p99.9 | begin p99 | commit p99 | CPU ms/pair bench / server / postgres / etcd / other | server RSS max | not OK |"
    );
    let _ = writeln!(
        out,
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|"
    );
    for row in rows {
        let per = |seconds: Option<f64>| match seconds {
            Some(s) if row.tally.pairs > 0 => format!("{:.2}", s * 1000.0 / row.tally.pairs as f64),
            _ => "–".to_owned(),
        };
        let failures = row.tally.failures();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.0} | {:.0} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {} / {} / {} / {} / {} | {} | {} |",
            row.scenario,
            row.clients,
            row.system,
            row.pairs_per_s(),
            row.claims_per_s(),
            row.tally.pair.ms(0.5),
            row.tally.pair.ms(0.99),
            row.tally.pair.ms(0.999),
            row.tally.begin.ms(0.99),
            row.tally.commit.ms(0.99),
            per(Some(row.cpu.bench)),
            per(row.cpu.server),
            per(Some(row.cpu.postgres)),
            per(row.cpu.etcd),
            per(Some(row.cpu.other())),
            row.server_rss_kib
                .map(|kib| format!("{:.0} MiB", kib as f64 / 1024.0))
                .unwrap_or_else(|| "–".into()),
            if failures.is_empty() { "–".to_owned() } else { failures.join(", ") },
        );
    }
    if !ratios.is_empty() {
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "| scenario | clients | system | baseline | ratio (pairs/s) | median of per-round ratios |"
        );
        let _ = writeln!(out, "|---|---:|---|---|---:|---:|");
        for r in ratios {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {:.2}× | {:.2}× |",
                r.scenario, r.clients, r.system, r.baseline, r.ratio, r.median_round_ratio
            );
        }
    }
    if rows.iter().any(|row| row.groups.is_some()) {
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "| scenario | clients | system | store transactions (groups) | calls | mean group size | groups by size |"
        );
        let _ = writeln!(out, "|---|---:|---|---:|---:|---:|---|");
        for row in rows {
            let Some(groups) = &row.groups else { continue };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {:.0} | {} | {} |",
                row.scenario,
                row.clients,
                row.system,
                groups.count,
                groups.sum,
                if groups.count > 0 {
                    format!("{:.2}", groups.mean())
                } else {
                    "–".to_owned()
                },
                groups.distribution(),
            );
        }
    }
    if !scale.is_empty() {
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "| system | claims | load | ListClaims p50 | p99 | LookupClaim p50 | p99 | server RSS |"
        );
        let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|");
        for s in scale {
            let ms = |op: &str, q: &str| s[op][q].as_f64().unwrap_or(0.0);
            let _ = writeln!(
                out,
                "| {} | {} | {:.1} s ({}) | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {} |",
                s["system"].as_str().unwrap_or(""),
                s["claims"],
                s["load_s"].as_f64().unwrap_or(0.0),
                s["load_path"].as_str().unwrap_or(""),
                ms("list_claims", "p50_ms"),
                ms("list_claims", "p99_ms"),
                ms("lookup_claim", "p50_ms"),
                ms("lookup_claim", "p99_ms"),
                s["server_rss_kib"]
                    .as_u64()
                    .map(|kib| format!("{:.0} MiB", kib as f64 / 1024.0))
                    .unwrap_or_else(|| "–".into()),
            );
        }
    }
    out
}
