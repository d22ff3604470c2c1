//! The benchmark's smoke mode through the real binaries: `topology-claims-bench --smoke` runs a few
//! seconds against the memory store (and PostgreSQL, raw SQL and etcd where present) and reports.
//! Asserts only that it runs and reports; speed is the benchmark's business, never a test's.
//! With CI=true PostgreSQL and etcd must be there (the bench refuses to skip them).
//! The verify mode (`--verify 2000`) runs both read paths and must repair exactly the drift it
//! injected, with a clean second run. The A/B mode (`--serve-variant`) starts one server per
//! store and variant, `sqlite:` in a fresh file that is gone afterwards, the noop baseline beside
//! them, and reports the combiner's batch sizes. The open-loop mode (`--rate`, `--slo`) sends
//! pairs on schedule and searches the rate within a latency objective, per system.
#![cfg(unix)]

use std::process::Command;

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_topology-claims-bench");

/// The bench without the ambient `TOPOLOGY_CLAIMS_*` settings (they would change what a run
/// measures) other than `keep`, logging warnings only.
fn bench(keep: &[&str]) -> Command {
    let mut command = Command::new(BIN);
    command.env("RUST_LOG", "warn");
    for (name, _) in std::env::vars() {
        if name.starts_with("TOPOLOGY_CLAIMS_") && !keep.contains(&name.as_str()) {
            command.env_remove(name);
        }
    }
    command
}

/// Runs `command`, which must succeed; its stdout.
fn succeed(mut command: Command, what: &str) -> String {
    let output = command.output().expect("run topology-claims-bench");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "bench {what} failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    stdout
}

/// The systems a JSON report measured, in order.
fn measured(report: &Value) -> Vec<&str> {
    report["systems"]
        .as_array()
        .expect("systems is a list")
        .iter()
        .filter_map(Value::as_str)
        .collect()
}

fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

#[test]
fn smoke_run_reports_every_system_it_measured_as_json_and_a_plot() {
    let dir = tempfile::tempdir().expect("temp dir");
    let json_path = dir.path().join("bench.json");
    let plot_path = dir.path().join("bench.png");
    let mut command = bench(&["TOPOLOGY_CLAIMS_TEST_POSTGRES_URL"]);
    command
        .arg("--smoke")
        .arg("--json")
        .arg(&json_path)
        .arg("--plot")
        .arg(&plot_path);
    let stdout = succeed(command, "--smoke");
    assert!(
        stdout.contains("| scenario | clients | system |"),
        "{stdout}"
    );

    let text = std::fs::read_to_string(&json_path).expect("the JSON report is written");
    let report: Value = serde_json::from_str(&text).expect("the JSON report parses");
    for key in [
        "config", "machine", "systems", "skipped", "results", "ratios", "scale",
    ] {
        assert!(report.get(key).is_some(), "missing {key:?} in {report:#}");
    }
    let results = report["results"].as_array().expect("results is a list");
    let memory = results
        .iter()
        .find(|row| row["system"] == "memory" && row["scenario"] == "unique")
        .expect("a memory row");
    assert!(memory["pairs"].as_u64().unwrap_or(0) > 0, "{memory:#}");
    for key in ["pairs_per_s", "claims_per_s", "latency", "outcomes", "cpu"] {
        assert!(memory.get(key).is_some(), "missing {key:?} in {memory:#}");
    }
    for rpc in ["begin", "commit", "pair"] {
        for quantile in ["p50_ms", "p90_ms", "p99_ms", "p99_9_ms"] {
            assert!(
                memory["latency"][rpc][quantile].as_f64().is_some(),
                "missing latency.{rpc}.{quantile} in {memory:#}"
            );
        }
    }
    let hot = results
        .iter()
        .find(|row| row["system"] == "memory" && row["scenario"] == "hot")
        .expect("a hot-scenario row");
    assert!(hot["outcomes"].as_object().is_some_and(|o| !o.is_empty()));
    let scale = report["scale"].as_array().expect("scale is a list");
    assert!(
        scale
            .iter()
            .any(|s| s["system"] == "memory" && s["claims"] == 1000),
        "{scale:#?}"
    );

    let systems = measured(&report);
    let skipped: Vec<&str> = report["skipped"]
        .as_array()
        .expect("skipped is a list")
        .iter()
        .filter_map(|s| s["system"].as_str())
        .collect();
    // Every system is either measured or named as skipped: nothing disappears silently.
    for system in ["postgres", "raw-sql", "etcd", "noop"] {
        assert!(
            systems.contains(&system) || skipped.contains(&system),
            "{system} neither measured nor reported skipped: {systems:?} / {skipped:?}"
        );
    }
    if ci() {
        for system in ["postgres", "raw-sql", "raw-sql-pipelined", "etcd"] {
            assert!(
                systems.contains(&system),
                "CI=true but no {system} row: {systems:?}"
            );
        }
    }
    // A measured system that completed no pair is broken, not slow (the raw-SQL baselines once
    // sent the claims insert four parameters short and reported only failures).
    for row in results.iter().filter(|row| row["scenario"] == "unique") {
        assert!(
            row["pairs"].as_u64().unwrap_or(0) > 0,
            "{} completed no pair in the unique scenario: {row:#}",
            row["system"]
        );
    }
    if systems.contains(&"postgres") {
        let ratios = report["ratios"].as_array().expect("ratios is a list");
        assert!(
            ratios
                .iter()
                .any(|r| r["system"] == "postgres" && r["baseline"] == "raw-sql"),
            "{ratios:#?}"
        );
    }

    let png = std::fs::read(&plot_path).expect("the plot is written");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
}

#[test]
fn open_loop_rates_and_a_tiny_slo_search_report_every_system_on_schedule() {
    let dir = tempfile::tempdir().expect("temp dir");
    let json_path = dir.path().join("open.json");
    let plot_path = dir.path().join("open.png");
    let mut command = bench(&[]);
    command
        .args([
            "--store",
            "memory:",
            "--baselines",
            "noop",
            "--scenario",
            "unique",
        ])
        .args(["--rate", "50,200", "--max-in-flight", "8"])
        .args(["--duration", "300ms", "--warmup", "50ms", "--rounds", "1"])
        .args([
            "--slo",
            "50ms",
            "--slo-quantile",
            "0.99",
            "--slo-segment",
            "200ms",
        ])
        .args([
            "--slo-start-rate",
            "100",
            "--slo-max-rate",
            "400",
            "--slo-steps",
            "1",
        ])
        .args(["--preload", "0", "--json"])
        .arg(&json_path)
        .arg("--plot")
        .arg(&plot_path);
    let stdout = succeed(command, "--rate/--slo");
    assert!(
        stdout.contains("| scenario | offered pairs/s | system |"),
        "{stdout}"
    );
    assert!(stdout.contains("| rate at SLO (pairs/s) |"), "{stdout}");

    let text = std::fs::read_to_string(&json_path).expect("the JSON report is written");
    let report: Value = serde_json::from_str(&text).expect("the JSON report parses");
    assert_eq!(measured(&report), ["memory", "noop"], "{report:#}");
    assert_eq!(report["config"]["rates"], serde_json::json!([50.0, 200.0]));
    let rows = report["open_loop"].as_array().expect("open_loop is a list");
    assert_eq!(rows.len(), 4, "{rows:#?}");
    for row in rows {
        // The schedule alone decides the arrivals: rate × measured time.
        let rate = row["rate"].as_f64().expect("rate");
        let arrivals = row["arrivals"].as_u64().expect("arrivals");
        assert!(
            (arrivals as f64 - rate * 0.3).abs() <= 1.0,
            "{arrivals} arrivals at {rate}/s in 300 ms: {row:#}"
        );
        assert!(row["pairs"].as_u64().unwrap_or(0) > 0, "{row:#}");
        assert!(
            row["peak_in_flight"].as_u64().expect("peak") <= 8,
            "{row:#}"
        );
        for key in ["missed", "late", "not_sent", "waited_for_connection"] {
            assert!(row[key].as_u64().is_some(), "missing {key:?} in {row:#}");
        }
        for rpc in ["begin", "commit", "pair"] {
            for quantile in ["p50_ms", "p99_ms", "p99_9_ms", "p99_95_ms"] {
                assert!(
                    row["latency"][rpc][quantile].as_f64().is_some(),
                    "missing latency.{rpc}.{quantile} in {row:#}"
                );
            }
        }
    }

    let searches = report["slo"].as_array().expect("slo is a list");
    let systems: Vec<&str> = searches
        .iter()
        .filter_map(|s| s["system"].as_str())
        .collect();
    assert_eq!(systems, ["memory", "noop"], "{searches:#?}");
    for search in searches {
        assert_eq!(search["scenario"], "unique", "{search:#}");
        assert_eq!(search["quantile"], 0.99, "{search:#}");
        assert_eq!(search["threshold_ms"], 50.0, "{search:#}");
        let segments = search["segments"].as_array().expect("segments");
        assert_eq!(
            segments[0]["rate"], 100.0,
            "the search starts at --slo-start-rate"
        );
        let passed = segments
            .iter()
            .filter(|s| s["passed"].as_bool().expect("passed"))
            .filter_map(|s| s["rate"].as_f64())
            .fold(None, |best: Option<f64>, r| {
                Some(best.map_or(r, |b| b.max(r)))
            });
        // The rate at SLO is the highest rate measured within the objective, or none.
        assert_eq!(search["rate_at_slo"].as_f64(), passed, "{search:#}");
        for segment in segments {
            let rate = segment["rate"].as_f64().expect("rate");
            assert!((1.0..=400.0).contains(&rate), "{segment:#}");
        }
    }

    let png = std::fs::read(&plot_path).expect("the plot is written");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
}

#[test]
fn tls_both_measures_a_plaintext_and_a_mutual_tls_server_side_by_side() {
    let mut command = bench(&[]);
    command
        .args([
            "--store",
            "memory:",
            "--tls",
            "both",
            "--scenario",
            "unique",
        ])
        .args(["--clients", "2", "--duration", "200ms", "--warmup", "50ms"])
        .args(["--rounds", "1", "--preload", "0"]);
    let stdout = succeed(command, "--tls both");
    // Each client presented its cell's certificate: a refused call would be "not OK".
    for system in ["| memory |", "| memory-tls |"] {
        let row = stdout
            .lines()
            .find(|line| line.contains(system))
            .unwrap_or_else(|| panic!("no {system} row in:\n{stdout}"));
        assert!(row.ends_with("| – |"), "calls failed: {row}");
    }
}

#[test]
fn serve_variants_run_each_store_once_per_variant_beside_the_noop_baseline() {
    let dir = tempfile::tempdir().expect("temp dir");
    let json_path = dir.path().join("ab.json");
    // The bench's own temporary files (the SQLite stores) go here, so their removal is visible.
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).expect("temp subdir");
    let mut command = bench(&[]);
    command
        .args(["--store", "memory:,sqlite:", "--baselines", "noop"])
        .args(["--serve-variant", "on=--group-commit=on --group-max=64"])
        .args(["--serve-variant", "off=--group-commit=off"])
        .args(["--scenario", "unique,hot", "--hot-keys", "50"])
        .args(["--clients", "8", "--duration", "300ms", "--warmup", "50ms"])
        .args(["--rounds", "1", "--preload", "0", "--json"])
        .arg(&json_path)
        .env("TMPDIR", &tmp);
    let stdout = succeed(command, "--serve-variant");
    let left: Vec<_> = std::fs::read_dir(&tmp)
        .expect("read the temp dir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert!(left.is_empty(), "the bench left {left:?} behind");

    let text = std::fs::read_to_string(&json_path).expect("the JSON report is written");
    let report: Value = serde_json::from_str(&text).expect("the JSON report parses");
    let systems = measured(&report);
    assert_eq!(
        systems,
        ["memory/on", "memory/off", "sqlite/on", "sqlite/off", "noop"],
        "{report:#}"
    );
    assert_eq!(report["config"]["serve_variants"][1]["name"], "off");
    let results = report["results"].as_array().expect("results is a list");
    for row in results {
        let system = row["system"].as_str().expect("system");
        assert!(row["pairs"].as_u64().unwrap_or(0) > 0, "{row:#}");
        if row["scenario"] == "unique" {
            assert!(
                row["outcomes"]
                    .as_object()
                    .expect("outcomes")
                    .keys()
                    .all(|k| k.ends_with(":OK")),
                "{row:#}"
            );
        }
        let groups = &row["group_commit"];
        if system == "noop" {
            assert!(groups.is_null(), "{row:#}");
            assert!(row["cpu"]["server_s"].as_f64().is_some(), "{row:#}");
            continue;
        }
        let count = groups["groups"].as_u64().expect("group count");
        let calls = groups["calls"].as_f64().expect("calls");
        let by_size: u64 = groups["distribution"]
            .as_array()
            .expect("distribution")
            .iter()
            .map(|d| d["groups"].as_u64().expect("groups"))
            .sum();
        assert_eq!(by_size, count, "{row:#}");
        if system.ends_with("/off") || system.starts_with("memory/") {
            // Without group commit the combiner forms no groups at all; the in-memory store
            // has no transaction to share and runs calls directly whatever the flag says.
            assert_eq!(count, 0, "{row:#}");
        } else {
            // The measured calls went through the combiner: about a begin and a commit per
            // pair (the scrapes bracket the measured part only roughly); groups carry at least
            // one call each and at most --group-max.
            let pairs = row["pairs"].as_u64().expect("pairs");
            assert!(calls >= pairs as f64, "{row:#}");
            let mean = groups["mean_size"].as_f64().expect("mean");
            assert!(count > 0 && (1.0..=64.0).contains(&mean), "{row:#}");
        }
    }
    let ratios = report["ratios"].as_array().expect("ratios is a list");
    for system in ["memory/on", "memory/off", "sqlite/on", "sqlite/off"] {
        assert!(
            ratios.iter().any(|r| r["system"] == system
                && r["baseline"] == "noop"
                && r["ratio"].as_f64().is_some_and(|x| x > 0.0)),
            "no ratio of {system} to noop: {ratios:#?}"
        );
    }
    assert!(
        stdout.contains("| store transactions (groups) |"),
        "{stdout}"
    );
}

#[test]
fn verify_mode_repairs_the_injected_drift_streaming_and_paging_and_a_second_run_is_clean() {
    let dir = tempfile::tempdir().expect("temp dir");
    let json_path = dir.path().join("verify.json");
    let postgres = std::env::var("TOPOLOGY_CLAIMS_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let mut command = bench(&[]);
    command
        .args(["--store", &postgres, "--verify", "2000", "--drift", "0.01"])
        .args(["--rounds", "1", "--json"])
        .arg(&json_path);
    let output = command.output().expect("run topology-claims-bench");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() && !ci() && stderr.contains("cannot connect to PostgreSQL") {
        eprintln!("skipped: no PostgreSQL at {postgres} (CI=true makes this a failure)");
        return;
    }
    assert!(
        output.status.success(),
        "bench --verify failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    assert!(stdout.contains("| records | mode |"), "{stdout}");

    let text = std::fs::read_to_string(&json_path).expect("the JSON report is written");
    let report: Value = serde_json::from_str(&text).expect("the JSON report parses");
    let runs = report["verify"].as_array().expect("verify is a list");
    let modes: Vec<&str> = runs.iter().filter_map(|r| r["mode"].as_str()).collect();
    assert_eq!(modes, ["stream", "paging (--no-stream)"], "{report:#}");
    for run in runs {
        // 1% of 2000 records of each kind.
        assert_eq!(run["injected_per_kind"], 20, "{run:#}");
        let drift = &run["drift_run"];
        for kind in ["missing", "different", "extra"] {
            assert_eq!(drift[kind], 20, "{kind}: {run:#}");
        }
        assert_eq!(drift["failed"], 0, "{run:#}");
        // A "different" claim is one correction (an update) or two (destroy, then create).
        let corrected = drift["corrected"].as_u64().expect("corrected");
        assert!((60..=80).contains(&corrected), "{run:#}");
        assert!(
            drift["records_per_s"].as_f64().unwrap_or(0.0) > 0.0,
            "{run:#}"
        );
        let clean = &run["clean_run"];
        for kind in ["missing", "different", "extra", "corrected", "failed"] {
            assert_eq!(clean[kind], 0, "clean run {kind}: {run:#}");
        }
    }
}

#[test]
fn read_path_mode_measures_rest_against_grpc_and_the_watch_lag() {
    let mut command = bench(&[]);
    command
        .args(["--store", "memory:", "--read-path", "--read-keys", "50"])
        .args([
            "--clients",
            "1,4",
            "--duration",
            "300ms",
            "--warmup",
            "50ms",
        ])
        .args(["--rounds", "1", "--watch-rate", "200"]);
    let stdout = succeed(command, "--read-path");
    assert!(stdout.contains("REST p99 / gRPC p99"), "{stdout}");
    for clients in [
        "      1  gRPC",
        "      1  REST",
        "      4  gRPC",
        "      4  REST",
    ] {
        assert!(stdout.contains(clients), "no {clients:?} row: {stdout}");
    }
    assert!(stdout.contains("watch lag"), "{stdout}");
    assert!(stdout.contains(", 0 events missing"), "{stdout}");
}

/// `--variant-sql` runs its statement in its variant's schema only, before that server starts
/// (here: the change feed's triggers disabled, the A/B of docs/benchmarks.md).
#[test]
fn variant_sql_runs_in_the_variants_schema_before_its_server_starts() {
    let url = std::env::var("TOPOLOGY_CLAIMS_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let mut command = bench(&[]);
    command
        .args(["--store", &url, "--serve-variant", "feed="])
        .args(["--serve-variant", "no-feed="])
        .args([
            "--variant-sql",
            "no-feed=ALTER TABLE claims DISABLE TRIGGER USER",
        ])
        .args(["--clients", "2", "--duration", "200ms", "--warmup", "50ms"])
        .args(["--rounds", "1", "--preload", "0"]);
    let output = command.output().expect("run topology-claims-bench");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert_eq!(
        stderr
            .lines()
            .filter(
                |l| l.contains("bench: no-feed: ran \"ALTER TABLE claims DISABLE TRIGGER USER\"")
            )
            .count(),
        1,
        "{stderr}"
    );
}
