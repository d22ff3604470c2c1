//! The latency objective (`--slo 20ms`): for each system and scenario, the highest open-loop
//! rate at which both RPCs' `--slo-quantile` (default p99.9, counted from the scheduled start)
//! stays within the threshold. The search doubles from `--slo-start-rate` until a step fails
//! (halving instead while the first ones fail), then bisects `--slo-steps` times between the
//! highest rate that passed and the lowest that failed; each step is one measured open-loop
//! segment of `--slo-segment`. The systems' searches advance a step each in turn (A B C, A B C…),
//! like the closed loop's rounds, so the machine's drift hits them alike.
//!
//! Owns the search, the verdict of a step and the SLO report. Must not drive load itself
//! (`open_loop` does).

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{json, Value};
use topology_claims::config::parse_duration;

use super::open_loop::{self, OpenSegment, Plan};
use super::systems::{Conn, PgSchema, System};
use super::workload::Scenario;

/// Below this rate (pairs/s) a search that keeps failing stops: no rate meets the objective.
const MIN_RATE: f64 = 1.0;
/// Bisection stops early once the bracket is this narrow (highest failed / highest passed).
const NARROW: f64 = 1.02;

/// The flags of the SLO search.
#[derive(clap::Args, Debug, Clone)]
pub struct SloArgs {
    /// Latency objective per RPC (e.g. 20ms): searches, for each system and scenario, the
    /// highest open-loop rate at which BeginUpdate's and CommitUpdate's --slo-quantile, counted
    /// from each pair's scheduled start, stays within it. Instead of the closed loop. Default:
    /// none (no search).
    #[arg(long, env = "TOPOLOGY_CLAIMS_BENCH_SLO", value_parser = parse_duration)]
    pub slo: Option<Duration>,

    /// The quantile the objective holds at, above 0 and below 1. Default 0.999 (p99.9).
    #[arg(long, env = "TOPOLOGY_CLAIMS_BENCH_SLO_QUANTILE", default_value_t = 0.999,
          value_parser = parse_quantile)]
    pub slo_quantile: f64,

    /// Measured time of each search step (after --warmup at the same rate). Default 5s.
    #[arg(long, env = "TOPOLOGY_CLAIMS_BENCH_SLO_SEGMENT", default_value = "5s",
          value_parser = parse_duration)]
    pub slo_segment: Duration,

    /// The search's first rate in pairs/s. Default 100.
    #[arg(long, env = "TOPOLOGY_CLAIMS_BENCH_SLO_START_RATE", default_value_t = 100.0,
          value_parser = open_loop::parse_rate)]
    pub slo_start_rate: f64,

    /// The highest rate searched in pairs/s; a system still within the objective there is
    /// reported at it, marked "capped". Default 100000.
    #[arg(long, env = "TOPOLOGY_CLAIMS_BENCH_SLO_MAX_RATE", default_value_t = 100_000.0,
          value_parser = open_loop::parse_rate)]
    pub slo_max_rate: f64,

    /// Bisection steps once one rate passed and a higher one failed. Default 4 (the bracket is
    /// then within 1/16 of the passing rate's distance to the failing one).
    #[arg(long, env = "TOPOLOGY_CLAIMS_BENCH_SLO_STEPS", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(0..=20))]
    pub slo_steps: u32,
}

fn parse_quantile(text: &str) -> Result<f64, String> {
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|q| *q > 0.0 && *q < 1.0)
        .ok_or_else(|| format!("invalid quantile {text:?}: above 0 and below 1, e.g. 0.999"))
}

/// Where a search stands: the highest rate that passed, the lowest that failed.
#[derive(Clone, Debug)]
pub struct Search {
    start: f64,
    max: f64,
    steps: u32,
    passed: Option<f64>,
    failed: Option<f64>,
    bisected: u32,
}

impl Search {
    pub fn new(start: f64, max: f64, steps: u32) -> Self {
        Self {
            start: start.min(max),
            max,
            steps,
            passed: None,
            failed: None,
            bisected: 0,
        }
    }

    /// The next rate to measure, or `None` when the search is over.
    pub fn next(&self) -> Option<f64> {
        match (self.passed, self.failed) {
            (None, None) => Some(self.start),
            (Some(passed), None) => (passed < self.max).then(|| (passed * 2.0).min(self.max)),
            (None, Some(failed)) => Some(failed / 2.0).filter(|r| *r >= MIN_RATE),
            (Some(passed), Some(failed)) => (self.bisected < self.steps
                && failed / passed > NARROW)
                .then_some((passed + failed) / 2.0),
        }
    }

    pub fn record(&mut self, rate: f64, passed: bool) {
        if self.passed.is_some() && self.failed.is_some() {
            self.bisected += 1;
        }
        if passed {
            self.passed = Some(self.passed.map_or(rate, |p| p.max(rate)));
        } else {
            self.failed = Some(self.failed.map_or(rate, |f| f.min(rate)));
        }
    }

    /// The highest rate measured within the objective.
    pub fn rate_at_slo(&self) -> Option<f64> {
        self.passed
    }

    /// Within the objective at `--slo-max-rate`: the system may sustain more.
    pub fn capped(&self) -> bool {
        self.passed.is_some_and(|p| p >= self.max)
    }
}

/// One step of a search: the segment and its verdict.
pub struct Step {
    pub segment: OpenSegment,
    /// BeginUpdate's and CommitUpdate's latency at the quantile, from the scheduled start;
    /// `None`: the quantile falls among calls that failed or were never sent.
    pub begin_ms: Option<f64>,
    pub commit_ms: Option<f64>,
    pub passed: bool,
}

impl Step {
    /// Judges `segment` against `threshold` at `quantile`. Failed calls (other than answers
    /// about the claims) and arrivals never sent count as slower than any threshold.
    pub fn judge(segment: OpenSegment, quantile: f64, threshold: Duration) -> Self {
        let t = &segment.tally;
        let begin_ms = t
            .tally
            .begin
            .ms_with_failures(quantile, t.begin_failed + t.not_sent);
        let commit_ms = t.tally.commit.ms_with_failures(quantile, t.commit_failed);
        let limit = threshold.as_secs_f64() * 1000.0;
        let within = |ms: Option<f64>| ms.is_some_and(|ms| ms <= limit);
        let passed = t.tally.pairs > 0 && within(begin_ms) && within(commit_ms);
        Self {
            segment,
            begin_ms,
            commit_ms,
            passed,
        }
    }

    fn to_json(&self) -> Value {
        let mut json = self.segment.to_json();
        json["passed"] = json!(self.passed);
        json["begin_at_quantile_ms"] = json!(self.begin_ms);
        json["commit_at_quantile_ms"] = json!(self.commit_ms);
        json
    }
}

/// The search of one system at one scenario.
pub struct SloResult {
    pub system: String,
    pub baseline: bool,
    pub scenario: Scenario,
    pub quantile: f64,
    pub threshold: Duration,
    pub batch: usize,
    pub search: Search,
    pub steps: Vec<Step>,
    /// A step that could not run (the system died, a connection was refused): the search
    /// stopped there.
    pub error: Option<String>,
}

impl SloResult {
    /// The step measured at the rate at SLO.
    fn best(&self) -> Option<&Step> {
        let rate = self.search.rate_at_slo()?;
        self.steps
            .iter()
            .find(|s| s.passed && s.segment.rate == rate)
    }

    pub fn to_json(&self) -> Value {
        json!({
            "system": self.system,
            "scenario": self.scenario.name(),
            "rate_at_slo": self.search.rate_at_slo(),
            "claims_per_s_at_slo": self.search.rate_at_slo().map(|r| r * self.batch as f64),
            "capped": self.search.capped(),
            "quantile": self.quantile,
            "threshold_ms": self.threshold.as_secs_f64() * 1000.0,
            "segments": self.steps.iter().map(Step::to_json).collect::<Vec<_>>(),
            "error": self.error,
        })
    }
}

/// Searches every system at every scenario, the systems' steps in turn. Each system keeps its
/// connections in `pools` (same index).
pub async fn run(
    systems: &mut [System],
    pools: &mut [Vec<Conn>],
    scenarios: &[Scenario],
    args: &SloArgs,
    threshold: Duration,
    plan: &mut Plan,
    schemas: &[PgSchema],
) -> Vec<SloResult> {
    let mut results = Vec::new();
    for &scenario in scenarios {
        let mut searches: Vec<SloResult> = systems
            .iter()
            .map(|system| SloResult {
                system: system.label(),
                baseline: system.is_baseline(),
                scenario,
                quantile: args.slo_quantile,
                threshold,
                batch: plan.batch,
                search: Search::new(args.slo_start_rate, args.slo_max_rate, args.slo_steps),
                steps: Vec::new(),
                error: None,
            })
            .collect();
        loop {
            // Between rounds of steps, as between the closed loop's groups.
            super::pg::vacuum_schemas(schemas).await;
            let mut stepped = false;
            for ((system, pool), result) in
                systems.iter_mut().zip(pools.iter_mut()).zip(&mut searches)
            {
                let Some(rate) = result.search.next().filter(|_| result.error.is_none()) else {
                    continue;
                };
                stepped = true;
                let spec = plan.spec(scenario, rate, args.slo_segment);
                match open_loop::run(system, pool, &spec).await {
                    Ok(segment) => {
                        let step = Step::judge(segment, args.slo_quantile, threshold);
                        result.search.record(rate, step.passed);
                        result.steps.push(step);
                    }
                    Err(error) => {
                        eprintln!(
                            "bench: SLO search of {} {scenario} at {rate:.0} pairs/s: {error}",
                            result.system
                        );
                        result.error = Some(error);
                    }
                }
            }
            if !stepped {
                break;
            }
        }
        results.extend(searches);
    }
    results
}

/// The SLO tables: the rate each system sustains within the objective, and each service's
/// rate against each baseline's.
pub fn markdown(results: &[SloResult]) -> String {
    let mut out = String::new();
    let Some(first) = results.first() else {
        return out;
    };
    let q = quantile_label(first.quantile);
    let _ = writeln!(
        out,
        "| scenario | system | rate at SLO (pairs/s) | claims/s | begin {q} | commit {q} | pair p99.9 | missed | steps (pairs/s, ✓ within / ✗ not) |"
    );
    let _ = writeln!(out, "|---|---|---:|---:|---:|---:|---:|---:|---|");
    let ms = |v: Option<f64>| v.map_or("failed".to_owned(), |v| format!("{v:.2} ms"));
    for r in results {
        let best = r.best();
        let steps: Vec<String> = r
            .steps
            .iter()
            .map(|s| {
                format!(
                    "{} {}",
                    rate_label(s.segment.rate),
                    if s.passed { "✓" } else { "✗" }
                )
            })
            .chain(r.error.iter().map(|e| format!("error: {e}")))
            .collect();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.scenario,
            r.system,
            match r.search.rate_at_slo() {
                Some(rate) if r.search.capped() => format!("≥ {} (capped)", rate_label(rate)),
                Some(rate) => rate_label(rate),
                None => "none".to_owned(),
            },
            r.search
                .rate_at_slo()
                .map_or("–".to_owned(), |rate| format!(
                    "{:.0}",
                    rate * r.batch as f64
                )),
            best.map_or("–".to_owned(), |s| ms(s.begin_ms)),
            best.map_or("–".to_owned(), |s| ms(s.commit_ms)),
            best.map_or("–".to_owned(), |s| format!(
                "{:.2} ms",
                s.segment.tally.tally.pair.ms(0.999)
            )),
            best.map_or("–".to_owned(), |s| s.segment.tally.missed().to_string()),
            steps.join(", "),
        );
    }
    let mut ratios = String::new();
    for system in results.iter().filter(|r| !r.baseline) {
        for baseline in results
            .iter()
            .filter(|r| r.baseline && r.scenario == system.scenario)
        {
            if let (Some(s), Some(b)) = (system.search.rate_at_slo(), baseline.search.rate_at_slo())
            {
                let _ = writeln!(
                    ratios,
                    "| {} | {} | {} | {:.2}× |",
                    system.scenario,
                    system.system,
                    baseline.system,
                    s / b
                );
            }
        }
    }
    if !ratios.is_empty() {
        let _ = writeln!(out);
        let _ = writeln!(out, "| scenario | system | baseline | rate at SLO ratio |");
        let _ = writeln!(out, "|---|---|---|---:|");
        out.push_str(&ratios);
    }
    out
}

/// A rate in pairs/s as the tables show it: whole above 100, else to two decimals at most
/// (the search's halvings and bisections give 12.5, 8.75…).
pub fn rate_label(rate: f64) -> String {
    if rate >= 100.0 {
        format!("{rate:.0}")
    } else {
        let text = format!("{rate:.2}");
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    }
}

/// `p99.9` for 0.999, `p99.95` for 0.9995.
pub fn quantile_label(quantile: f64) -> String {
    let percent = format!("{:.4}", quantile * 100.0);
    format!("p{}", percent.trim_end_matches('0').trim_end_matches('.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rates a search measures against a system that meets the objective up to `capacity`.
    fn searched(mut search: Search, capacity: f64) -> (Vec<f64>, Search) {
        let mut rates = Vec::new();
        while let Some(rate) = search.next() {
            assert!(rates.len() < 50, "the search does not end: {rates:?}");
            rates.push(rate);
            search.record(rate, rate <= capacity);
        }
        (rates, search)
    }

    #[test]
    fn the_search_doubles_until_a_rate_fails_then_bisects() {
        let (rates, search) = searched(Search::new(100.0, 100_000.0, 4), 1234.0);
        assert_eq!(
            rates,
            [100.0, 200.0, 400.0, 800.0, 1600.0, 1200.0, 1400.0, 1300.0, 1250.0]
        );
        assert_eq!(search.rate_at_slo(), Some(1200.0));
        assert!(!search.capped());
    }

    #[test]
    fn a_failing_start_halves_until_a_rate_passes() {
        let (rates, search) = searched(Search::new(100.0, 100_000.0, 2), 30.0);
        assert_eq!(rates, [100.0, 50.0, 25.0, 37.5, 31.25]);
        assert_eq!(search.rate_at_slo(), Some(25.0));
    }

    #[test]
    fn a_system_that_never_meets_the_objective_has_no_rate_at_slo() {
        let (rates, search) = searched(Search::new(100.0, 100_000.0, 4), 0.0);
        assert_eq!(rates.last(), Some(&1.5625));
        assert_eq!(search.rate_at_slo(), None);
    }

    #[test]
    fn the_search_stops_at_the_maximum_rate_and_says_so() {
        let (rates, search) = searched(Search::new(100.0, 1000.0, 4), f64::INFINITY);
        assert_eq!(rates, [100.0, 200.0, 400.0, 800.0, 1000.0]);
        assert_eq!(search.rate_at_slo(), Some(1000.0));
        assert!(search.capped());
    }

    #[test]
    fn rates_show_the_search_s_fractions_below_100() {
        assert_eq!(rate_label(1250.4), "1250");
        assert_eq!(rate_label(12.5), "12.5");
        assert_eq!(rate_label(8.75), "8.75");
        assert_eq!(rate_label(25.0), "25");
    }

    #[test]
    fn quantiles_are_labelled_as_percentiles() {
        assert_eq!(quantile_label(0.999), "p99.9");
        assert_eq!(quantile_label(0.9995), "p99.95");
        assert_eq!(quantile_label(0.5), "p50");
    }
}
