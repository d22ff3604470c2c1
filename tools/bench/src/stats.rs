//! Measurements of the benchmark: latency histograms (HdrHistogram, microseconds), outcome counts
//! by status reason, and the per-segment record that reports and ratios are computed from.
//!
//! Owns arithmetic over measurements only; no I/O and no knowledge of the systems measured.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde_json::{json, Value};

use super::group_sizes::GroupSizes;

/// Highest latency a histogram holds exactly (longer ones are clamped): one minute.
const MAX_MICROS: u64 = 60_000_000;

/// A latency histogram in microseconds, 3 significant digits.
#[derive(Clone)]
pub struct Latency(Histogram<u64>);

impl Default for Latency {
    fn default() -> Self {
        Self(
            Histogram::new_with_bounds(1, MAX_MICROS, 3).unwrap_or_else(|_| {
                // The bounds are constants that hdrhistogram accepts; an auto-resizing histogram is
                // the harmless fallback should that ever change.
                Histogram::new(3).unwrap_or_else(|_| unreachable!("3 significant digits are valid"))
            }),
        )
    }
}

impl Latency {
    pub fn record(&mut self, elapsed: Duration) {
        let micros = (elapsed.as_micros() as u64).clamp(1, MAX_MICROS);
        // Cannot fail: the value is clamped into the histogram's range.
        let _ = self.0.record(micros);
    }

    pub fn merge(&mut self, other: &Latency) {
        let _ = self.0.add(&other.0);
    }

    pub fn count(&self) -> u64 {
        self.0.len()
    }

    /// The latency at `quantile` (0..=1) in milliseconds; 0 when empty.
    pub fn ms(&self, quantile: f64) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        self.0.value_at_quantile(quantile) as f64 / 1000.0
    }

    pub fn to_json(&self) -> Value {
        json!({
            "count": self.count(),
            "p50_ms": self.ms(0.50),
            "p90_ms": self.ms(0.90),
            "p99_ms": self.ms(0.99),
            "p99_9_ms": self.ms(0.999),
            "max_ms": if self.0.is_empty() { 0.0 } else { self.0.max() as f64 / 1000.0 },
            "mean_ms": if self.0.is_empty() { 0.0 } else { self.0.mean() / 1000.0 },
        })
    }

    /// The tail an open-loop segment is judged by: p50, p99, p99.9, p99.95 and max.
    pub fn tail_json(&self) -> Value {
        json!({
            "count": self.count(),
            "p50_ms": self.ms(0.50),
            "p99_ms": self.ms(0.99),
            "p99_9_ms": self.ms(0.999),
            "p99_95_ms": self.ms(0.9995),
            "max_ms": if self.0.is_empty() { 0.0 } else { self.0.max() as f64 / 1000.0 },
        })
    }

    /// The latency at `quantile` in milliseconds when `failed` further calls count as slower
    /// than any measured one; `None` when the quantile falls among those failures.
    pub fn ms_with_failures(&self, quantile: f64, failed: u64) -> Option<f64> {
        let total = self.count() + failed;
        if total == 0 {
            return Some(0.0);
        }
        // The rank of the quantile among all calls, as hdrhistogram counts it.
        // (Less a hair: 0.999 × 1000 must be rank 999, not 1000 by rounding.)
        let rank = ((quantile * total as f64 - 1e-9).ceil() as u64).max(1);
        if rank > self.count() {
            return None;
        }
        // Half a call below the rank, so rounding cannot push the ceiling to the next call.
        Some(self.ms((rank as f64 - 0.5) / self.count() as f64))
    }
}

/// What one BeginUpdate + CommitUpdate did, timed from its start (the closed loop: when it was
/// sent; the open loop: when it was scheduled). The commit is sent as soon as the begin answers.
pub struct PairTiming {
    /// From the start until the begin's answer.
    pub begin: Duration,
    pub begun: Result<(), String>,
    /// From the begin's answer until the commit's; `None` when the begin failed.
    pub commit: Option<(Duration, Result<(), String>)>,
    pub claims: u64,
}

impl PairTiming {
    /// Whether both calls succeeded.
    pub fn succeeded(&self) -> bool {
        self.begun.is_ok() && matches!(self.commit, Some((_, Ok(()))))
    }
}

/// What one client (or a whole segment, once merged) measured.
#[derive(Clone, Default)]
pub struct Tally {
    pub begin: Latency,
    pub commit: Latency,
    /// BeginUpdate + CommitUpdate of one batch, both successful.
    pub pair: Latency,
    /// `begin:OK`, `begin:CLAIM_TAKEN`, `commit:OK`, … counts.
    pub outcomes: BTreeMap<String, u64>,
    pub pairs: u64,
    pub claims: u64,
}

impl Tally {
    pub fn outcome(&mut self, rpc: &str, reason: &str) {
        *self.outcomes.entry(format!("{rpc}:{reason}")).or_default() += 1;
    }

    pub fn merge(&mut self, other: &Tally) {
        self.begin.merge(&other.begin);
        self.commit.merge(&other.commit);
        self.pair.merge(&other.pair);
        for (key, count) in &other.outcomes {
            *self.outcomes.entry(key.clone()).or_default() += count;
        }
        self.pairs += other.pairs;
        self.claims += other.claims;
    }

    /// Counts one pair: every outcome, and the latencies of the calls that succeeded.
    pub fn add(&mut self, pair: &PairTiming) {
        if let Err(reason) = &pair.begun {
            self.outcome("begin", reason);
            return;
        }
        self.outcome("begin", "OK");
        self.begin.record(pair.begin);
        match &pair.commit {
            Some((commit, Ok(()))) => {
                self.outcome("commit", "OK");
                self.commit.record(*commit);
                self.pair.record(pair.begin + *commit);
                self.pairs += 1;
                self.claims += pair.claims;
            }
            Some((_, Err(reason))) => self.outcome("commit", reason),
            None => {}
        }
    }

    /// Outcomes other than OK, e.g. `begin:CLAIM_LEASED=12`.
    pub fn failures(&self) -> Vec<String> {
        self.outcomes
            .iter()
            .filter(|(key, _)| !key.ends_with(":OK"))
            .map(|(key, count)| format!("{key}={count}"))
            .collect()
    }
}

/// CPU seconds each process class spent during a measured segment.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu {
    /// The benchmark process itself (the load generator: clients, encoding, histograms).
    pub bench: f64,
    /// The `serve` child process (gRPC + domain + store adapter).
    pub server: Option<f64>,
    /// Every `postgres` process on the machine (backends, WAL writer, …).
    pub postgres: f64,
    /// The etcd child process.
    pub etcd: Option<f64>,
    /// The whole machine (all cores). What the classes above do not explain is other load on
    /// the machine, which the report shows so a disturbed segment is visible.
    pub machine: f64,
}

impl Cpu {
    pub fn add(&mut self, other: &Cpu) {
        self.bench += other.bench;
        self.postgres += other.postgres;
        self.machine += other.machine;
        self.server = add_opt(self.server, other.server);
        self.etcd = add_opt(self.etcd, other.etcd);
    }

    /// Machine CPU none of the measured processes used (other load; kernel work on their
    /// behalf not charged to them, such as loopback networking in softirq).
    pub fn other(&self) -> f64 {
        (self.machine
            - self.bench
            - self.server.unwrap_or(0.0)
            - self.postgres
            - self.etcd.unwrap_or(0.0))
        .max(0.0)
    }

    /// CPU milliseconds per pair of each class.
    pub fn to_json(self, pairs: u64) -> Value {
        let per = |seconds: f64| {
            if pairs == 0 {
                0.0
            } else {
                seconds * 1000.0 / pairs as f64
            }
        };
        json!({
            "bench_s": self.bench,
            "server_s": self.server,
            "postgres_s": self.postgres,
            "etcd_s": self.etcd,
            "machine_s": self.machine,
            "other_s": self.other(),
            "bench_ms_per_pair": per(self.bench),
            "server_ms_per_pair": self.server.map(per),
            "postgres_ms_per_pair": per(self.postgres),
            "etcd_ms_per_pair": self.etcd.map(per),
            "other_ms_per_pair": per(self.other()),
        })
    }
}

fn add_opt(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
    }
}

/// One measured segment: one system, scenario and client count for one round.
#[derive(Clone)]
pub struct Segment {
    pub system: String,
    pub scenario: String,
    pub clients: usize,
    pub elapsed: Duration,
    pub tally: Tally,
    pub cpu: Cpu,
    /// Largest resident set of the server child seen during the segment.
    pub server_rss_kib: Option<u64>,
    /// The groups the server's combiner formed during the measured part (`None`: not exported
    /// or not scraped).
    pub groups: Option<GroupSizes>,
}

impl Segment {
    pub fn pairs_per_s(&self) -> f64 {
        per_second(self.tally.pairs, self.elapsed)
    }
}

pub fn per_second(count: u64, elapsed: Duration) -> f64 {
    let seconds = elapsed.as_secs_f64();
    if seconds > 0.0 {
        count as f64 / seconds
    } else {
        0.0
    }
}

/// The median of some numbers (0 when empty).
pub fn median(values: &[f64]) -> f64 {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if sorted.is_empty() {
        return 0.0;
    }
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_tallies_add_counts_and_latencies() {
        let mut a = Tally::default();
        a.begin.record(Duration::from_millis(2));
        a.outcome("begin", "OK");
        a.pairs = 1;
        let mut b = Tally::default();
        b.begin.record(Duration::from_millis(4));
        b.outcome("begin", "CLAIM_TAKEN");
        b.outcome("begin", "OK");
        a.merge(&b);
        assert_eq!(a.begin.count(), 2);
        assert_eq!(a.outcomes["begin:OK"], 2);
        assert_eq!(a.failures(), vec!["begin:CLAIM_TAKEN=1".to_owned()]);
        assert!((a.begin.ms(1.0) - 4.0).abs() < 0.01);
    }

    #[test]
    fn failures_count_as_slower_than_every_measured_call() {
        let mut latency = Latency::default();
        for ms in 1..=99 {
            latency.record(Duration::from_millis(ms));
        }
        assert!((latency.ms_with_failures(0.5, 0).unwrap() - 50.0).abs() < 0.1);
        // One failure in 100 calls: p99 is the 99th call, still measured; p99.9 is the failure.
        assert!((latency.ms_with_failures(0.99, 1).unwrap() - 99.0).abs() < 0.1);
        assert_eq!(latency.ms_with_failures(0.999, 1), None);
        assert_eq!(Latency::default().ms_with_failures(0.999, 0), Some(0.0));
        assert_eq!(Latency::default().ms_with_failures(0.5, 3), None);
    }

    #[test]
    fn median_of_odd_and_even_lists() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }
}
