//! The campaign's output: the summary table (operations by outcome, transactions by ending,
//! faults by kind, violations), the failure report (seed, violation, minimal history), and the
//! `--history` file. Owns formatting only.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use crate::faults::FaultKind;
use crate::history::{Event, Outcome};
use crate::invariants::Violation;

/// Everything the summary shows.
pub struct Summary<'a> {
    pub header: Vec<(&'static str, String)>,
    pub duration: Duration,
    pub events: &'a [Event],
    pub endings: BTreeMap<String, u64>,
    /// Enabled kinds (all of them listed, even at zero) and how often each fired.
    pub faults: Vec<(FaultKind, u64)>,
    pub reconcile: Vec<(&'static str, u64)>,
    pub verify: Vec<(&'static str, u64)>,
    pub invariants: &'a [Violation],
    pub keys_checked: usize,
    pub linearizability: &'a [(u32, Vec<Event>)],
    pub inconclusive: &'a [u32],
    pub machinery_errors: &'a [String],
    pub seed: u64,
}

impl Summary<'_> {
    pub fn violations(&self) -> usize {
        self.invariants.len() + self.linearizability.len()
    }

    pub fn passed(&self) -> bool {
        self.violations() == 0 && self.inconclusive.is_empty() && self.machinery_errors.is_empty()
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "== chaos campaign summary ==");
        for (name, value) in &self.header {
            let _ = writeln!(out, "{name:<22} {value}");
        }
        let _ = writeln!(
            out,
            "{:<22} {:.1} s",
            "duration",
            self.duration.as_secs_f64()
        );

        let _ = writeln!(
            out,
            "\noperations by outcome     ok     fail  unknown    total"
        );
        let mut table: BTreeMap<(usize, &str), [u64; 3]> = BTreeMap::new();
        let order = ["begin", "commit", "rollback", "lookup", "probe", "ghost"];
        for event in self.events {
            let kind = event.call.kind();
            let rank = order.iter().position(|k| *k == kind).unwrap_or(order.len());
            let column = match event.answer.outcome() {
                Outcome::Ok => 0,
                Outcome::Fail => 1,
                Outcome::Unknown => 2,
            };
            table.entry((rank, kind)).or_default()[column] += 1;
        }
        let mut totals = [0u64; 3];
        for ((_, kind), counts) in &table {
            let label = if *kind == "ghost" {
                "ghost (inferred)"
            } else {
                kind
            };
            let _ = writeln!(
                out,
                "  {label:<20} {:>8} {:>8} {:>8} {:>8}",
                counts[0],
                counts[1],
                counts[2],
                counts.iter().sum::<u64>()
            );
            for (t, c) in totals.iter_mut().zip(counts) {
                *t += c;
            }
        }
        let _ = writeln!(
            out,
            "  {:<20} {:>8} {:>8} {:>8} {:>8}",
            "all",
            totals[0],
            totals[1],
            totals[2],
            totals.iter().sum::<u64>()
        );

        let _ = writeln!(out, "\ntransactions");
        for (what, n) in &self.endings {
            let _ = writeln!(out, "  {what:<44} {n:>8}");
        }
        let _ = writeln!(out, "\nreconcilers");
        for (what, n) in &self.reconcile {
            let _ = writeln!(out, "  {what:<44} {n:>8}");
        }

        let _ = writeln!(out, "\nverifiers");
        for (what, n) in &self.verify {
            let _ = writeln!(out, "  {what:<44} {n:>8}");
        }

        let _ = writeln!(out, "\nfaults injected");
        for (kind, n) in &self.faults {
            let _ = writeln!(out, "  {:<44} {n:>8}", kind.name());
        }
        let _ = writeln!(
            out,
            "  {:<44} {:>8}",
            "all",
            self.faults.iter().map(|(_, n)| n).sum::<u64>()
        );

        let _ = writeln!(out, "\nviolations");
        let _ = writeln!(
            out,
            "  {:<44} {:>8}",
            "state after healing (checker 1)",
            self.invariants.len()
        );
        let _ = writeln!(
            out,
            "  {:<44} {:>8}",
            format!("linearizability, {} keys (checker 2)", self.keys_checked),
            self.linearizability.len()
        );
        let _ = writeln!(
            out,
            "  {:<44} {:>8}",
            "keys not decided within the search budget",
            self.inconclusive.len()
        );
        let _ = writeln!(
            out,
            "  {:<44} {:>8}",
            "fault machinery errors",
            self.machinery_errors.len()
        );
        // One-line forms, for scripts and tests.
        let fired: Vec<String> = self
            .faults
            .iter()
            .map(|(kind, n)| format!("{}={n}", kind.name()))
            .collect();
        let _ = writeln!(out, "\nfaults: {}", fired.join(" "));
        let _ = writeln!(out, "violations: {}", self.violations());
        let _ = writeln!(out, "inconclusive: {}", self.inconclusive.len());
        let _ = writeln!(
            out,
            "result: {} (seed {})",
            if self.passed() { "PASS" } else { "FAIL" },
            self.seed
        );
        out
    }

    /// The failure report: each violation with the seed and the history that shows it.
    pub fn render_failures(&self) -> String {
        let mut out = String::new();
        if self.passed() {
            return out;
        }
        let _ = writeln!(
            out,
            "== FAILURE (seed {}: rerun with --seed {} for the same schedule) ==",
            self.seed, self.seed
        );
        for error in self.machinery_errors {
            let _ = writeln!(out, "fault machinery: {error}");
        }
        for key in self.inconclusive {
            let _ = writeln!(
                out,
                "k{key}: linearizability undecided within the search budget"
            );
        }
        for (key, minimal) in self.linearizability {
            let _ = writeln!(
                out,
                "\nk{key}: not linearizable; minimal history ({} calls):",
                minimal.len()
            );
            for event in minimal {
                let _ = writeln!(out, "  {event}");
            }
            // The rest of those leases' calls, past the cut: above all each probe, the fate that
            // decides the lease's ghost.
            let leases: Vec<_> = minimal.iter().filter_map(|e| e.call.lease()).collect();
            let rest: Vec<&Event> = self
                .events
                .iter()
                .filter(|e| e.call.lease().is_some_and(|l| leases.contains(&l)))
                .filter(|e| !minimal.iter().any(|m| m.id == e.id))
                .collect();
            if !rest.is_empty() {
                let _ = writeln!(
                    out,
                    "  the same leases' later calls (probes give their fates):"
                );
                for event in rest {
                    let _ = writeln!(out, "  {event}");
                }
            }
        }
        for violation in self.invariants {
            let _ = writeln!(out, "\n{violation}");
            if let Some(key) = violation.key {
                let of_key: Vec<&Event> =
                    self.events.iter().filter(|e| e.call.key() == key).collect();
                let skip = of_key.len().saturating_sub(40);
                let _ = writeln!(
                    out,
                    "  history of k{key} ({} calls{}):",
                    of_key.len(),
                    if skip > 0 { ", last 40" } else { "" }
                );
                for event in &of_key[skip..] {
                    let _ = writeln!(out, "  {event}");
                }
            }
        }
        out
    }
}

/// Writes every event, one per line, in invocation order.
pub fn write_history(path: &Path, seed: u64, events: &[Event]) -> Result<(), String> {
    let mut sorted: Vec<&Event> = events.iter().collect();
    sorted.sort_by_key(|e| (e.invoke, e.id));
    let mut text = format!(
        "# topology-claims-chaos history, seed {seed}: #id [invoke, return] cell call -> answer \
         (times in ms since the start; ∞: the outcome was lost)\n"
    );
    for event in sorted {
        let _ = writeln!(text, "{event}");
    }
    std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))
}
