//! The fault campaign through the real binaries (`topology-claims-chaos` driving
//! `topology-claims serve`): a CI-sized run must
//! find no violation while every fault kind fires and every cell's verifier runs again and again
//! (correcting the drift the campaign injects, never anything else, and clean after healing),
//! and a deliberately broken cell must be caught with the seed and the history that shows it.
//!
//! With `CI=true` the servers share a PostgreSQL cluster the campaign creates for itself
//! (`--store private-postgres:`: `initdb` + `pg_ctl` of the installed PostgreSQL), so
//! `pg-terminate` and `pg-restart` (a crash of the whole database server) fire too; otherwise a
//! SQLite file. A second campaign runs against the Cloud Spanner emulator started with
//! `--enable_fault_injection` (missing emulator: fails when CI=true, else one skip line). Each
//! run draws a fresh seed (printed in the summary): a failure is reproduced with
//! `topology-claims-chaos --seed S`. A shorter campaign runs with `--tls`: mutual TLS through
//! the fault proxy, each cell with its own certificate. A short campaign restores the store from
//! a backup in the middle of its workload (`store-restore`, on SQLite) and its checks must hold.
#![cfg(unix)]

use std::path::Path;
use std::process::Output;

use topology_claims_harness::in_ci;
use topology_claims_harness::serve::clean_command;

const BIN: &str = env!("CARGO_BIN_EXE_topology-claims-chaos");

/// `chaos` with a clean environment (no ambient TOPOLOGY_CLAIMS_* settings), run in `dir`.
fn chaos(dir: &Path, args: &[&str]) -> Output {
    chaos_with(dir, args, &[])
}

/// `chaos` with a clean environment plus `env`.
fn chaos_with(dir: &Path, args: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> Output {
    let mut command = clean_command(Path::new(BIN), args);
    command.current_dir(dir).env("RUST_LOG", "error");
    command.envs(env.iter().copied());
    command.output().expect("run topology-claims-chaos")
}

/// The client crashes, server kills and proxy faults every store gets.
const COMMON_FAULTS: [&str; 8] = [
    "crash-after-begin",
    "crash-in-local-tx",
    "crash-after-local-commit",
    "crash-after-commit",
    "server-kill",
    "proxy-drop",
    "proxy-delay",
    "proxy-reset",
];

/// A passing campaign: exit 0, no violation, every key decided. Prints the summary (it belongs
/// in the test log) and returns it.
fn assert_passed(output: Output) -> String {
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    println!("{stdout}");
    assert!(
        output.status.success(),
        "the campaign failed ({:?}):\n{stdout}\n{stderr}",
        output.status
    );
    assert!(stdout.contains("\nviolations: 0\n"), "{stdout}");
    assert!(stdout.contains("\ninconclusive: 0\n"), "{stdout}");
    assert!(stdout.contains("result: PASS"), "{stdout}");
    stdout
}

/// The count of the summary line that starts with `label` (e.g. `runs during the campaign`).
fn count(summary: &str, label: &str) -> u64 {
    summary
        .lines()
        .find_map(|l| l.trim_start().strip_prefix(label))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {label:?} line in:\n{summary}"))
}

/// The verifiers ran during the campaign and their final pass found nothing (a discrepancy
/// there is a violation too; this says it where it is read).
fn assert_verified(summary: &str) {
    assert!(count(summary, "runs during the campaign") > 0, "{summary}");
    assert_eq!(count(summary, "discrepancies in the final pass"), 0);
}

/// Each of `kinds` fired at least once, by the summary's `faults:` line.
fn assert_fired(summary: &str, kinds: &[&str]) {
    let fired = fired(summary);
    for kind in kinds {
        let count = fired.iter().find(|(name, _)| name == kind).map(|(_, n)| *n);
        assert!(
            count.is_some_and(|n| n > 0),
            "fault {kind} never fired: {fired:?}"
        );
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The `faults: name=count …` line of the summary.
fn fired(summary: &str) -> Vec<(String, u64)> {
    let line = summary
        .lines()
        .find_map(|l| l.strip_prefix("faults: "))
        .unwrap_or_else(|| panic!("no faults line in:\n{summary}"));
    line.split_whitespace()
        .map(|pair| {
            let (name, count) = pair.split_once('=').expect("name=count");
            (name.to_owned(), count.parse().expect("a count"))
        })
        .collect()
}

#[test]
fn ci_campaign_heals_every_fault_with_no_violation_and_linearizable_histories() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    let history = dir.path().join("history.txt");
    let mut args = vec![
        "--cells",
        "8",
        "--transactions",
        "2000",
        "--servers",
        "2",
        "--faults",
        "all",
        "--work-dir",
        work.to_str().unwrap(),
        "--history",
        history.to_str().unwrap(),
    ];
    if in_ci() {
        // Two of the cells on the campaign's own PostgreSQL, in the in-transaction order: their
        // crashes happen inside open local transactions that name themselves. A 4 s staleness
        // leaves the early rollback (a pass every 0.4–0.9 s) a wide margin over the fallback
        // on a loaded 2-core CI machine.
        args.extend([
            "--store",
            "private-postgres:",
            "--pg-cells",
            "2",
            "--staleness",
            "4s",
        ]);
    }
    let stdout = assert_passed(chaos(dir.path(), &args));
    if in_ci() {
        // Every crash point swept on both PostgreSQL cells: at least 2 × 2 × 2 crashes inside
        // an open local transaction (after BeginUpdate, after the lease row; create, destroy),
        // each freed early (else an invariant fails above).
        let line = stdout
            .lines()
            .find(|l| l.starts_with("time to free, with local_transaction"))
            .unwrap_or_else(|| panic!("no time-to-free line: {stdout}"));
        let crashed: u64 = line
            .split_whitespace()
            .find_map(|w| w.parse().ok())
            .unwrap_or_else(|| panic!("no count in {line:?}"));
        assert!(crashed >= 8, "{line}");
    }

    let mut expected = COMMON_FAULTS.to_vec();
    if in_ci() {
        expected.extend(["pg-terminate", "pg-restart"]);
    }
    assert_fired(&stdout, &expected);
    assert_verified(&stdout);
    // With 2 % of the random steps drifting a record, some drift is corrected; by one update
    // (a different owner) or one destroy (a forgotten record), never a destroy and a create.
    assert!(
        count(&stdout, "corrections committed (all runs)") > 0,
        "{stdout}"
    );
    let transactions = stdout
        .lines()
        .find_map(|l| l.strip_prefix("transactions"))
        .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
        .expect("a transactions line");
    assert!(transactions >= 2000, "{transactions} transactions");
    let recorded = std::fs::read_to_string(&history).unwrap();
    assert!(
        recorded.lines().count() > 2 * 2000,
        "every call is in the history file"
    );
}

#[test]
fn tls_campaign_where_each_cell_presents_its_own_certificate_has_no_violation() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    let args = [
        "--tls",
        "--cells",
        "8",
        "--transactions",
        "600",
        "--servers",
        "2",
        "--faults",
        "all",
        "--work-dir",
        work.to_str().unwrap(),
    ];
    let stdout = assert_passed(chaos(dir.path(), &args));
    assert_fired(&stdout, &COMMON_FAULTS);
    assert_verified(&stdout);
    // The campaign's own PKI, made by `topology-claims certs`: a CA, the servers' certificate
    // and one client certificate per cell.
    let pki = work.join("pki");
    let cell_certs = std::fs::read_dir(&pki)
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| name.starts_with("cell-") && !name.ends_with("-key.pem"))
        .count();
    assert!(pki.join("ca.pem").is_file() && pki.join("server.pem").is_file());
    assert_eq!(
        cell_certs,
        8,
        "one certificate per cell in {}",
        pki.display()
    );
}

/// The Cloud Spanner emulator binary, as the Spanner tests find it.
fn spanner_emulator() -> Option<std::path::PathBuf> {
    topology_claims_harness::spanner::emulator_binary().ok()
}

#[test]
fn spanner_campaign_under_emulator_aborts_has_no_violation_and_linearizable_histories() {
    let Some(emulator) = spanner_emulator() else {
        assert!(!in_ci(), "the Spanner campaign needs the emulator under CI");
        eprintln!("spanner chaos campaign skipped: no Cloud Spanner emulator");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    let output = chaos_with(
        dir.path(),
        &[
            "--store",
            "spanner-emulator:",
            "--cells",
            "4",
            "--keys",
            "16",
            "--transactions",
            "400",
            "--servers",
            "2",
            "--faults",
            "all",
            "--work-dir",
            work.to_str().unwrap(),
        ],
        &[("TOPOLOGY_CLAIMS_SPANNER_EMULATOR", emulator.as_os_str())],
    );
    let stdout = assert_passed(output);
    assert!(stdout.contains("--enable_fault_injection"), "{stdout}");
    assert_fired(&stdout, &COMMON_FAULTS);
    assert_verified(&stdout);
}

#[test]
fn a_store_restored_from_a_backup_mid_campaign_loses_no_claim_and_lifts_its_quarantine() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    let output = chaos(
        dir.path(),
        &[
            "--cells",
            "4",
            "--transactions",
            "800",
            "--faults",
            "store-restore,crash-after-begin,crash-after-local-commit,proxy-reset",
            "--work-dir",
            work.to_str().unwrap(),
        ],
    );
    // No violation: no key held by two cells' records, every record's claim its cell's, no
    // lease that created a record rolled back, the quarantine lifted; linearizable histories.
    let stdout = assert_passed(output);
    assert_fired(
        &stdout,
        &[
            "store-restore",
            "crash-after-begin",
            "crash-after-local-commit",
        ],
    );
    assert_eq!(
        fired(&stdout)
            .iter()
            .find(|(k, _)| k == "store-restore")
            .unwrap()
            .1,
        1
    );
    assert_verified(&stdout);
    assert!(stdout.contains("restore epoch: 1"), "{stdout}");
    // The summary says how many keys were checked only up to the backup, and how many creates
    // the quarantine refused (temporary refusals, not failures).
    let touched = count(&stdout, "restore: keys touched");
    assert!(touched <= 32, "{stdout}");
    count(&stdout, "RESTORE_QUARANTINE refusals");
}

#[test]
fn a_cell_that_does_not_record_its_leases_is_caught_with_the_seed_and_the_history() {
    let dir = tempfile::tempdir().unwrap();
    // A failing run keeps its work directory: keep it inside the test's.
    let work = dir.path().join("work");
    let output = chaos(
        dir.path(),
        &[
            "--work-dir",
            work.to_str().unwrap(),
            "--cells",
            "3",
            "--keys",
            "8",
            "--transactions",
            "60",
            "--faults",
            "crash-after-local-commit",
            "--sabotage",
            "skip-lease-record",
            "--seed",
            "9",
        ],
    );
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert_eq!(output.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(stdout.contains("result: FAIL (seed 9)"), "{stdout}");
    assert!(!stdout.contains("\nviolations: 0\n"), "{stdout}");
    assert!(stderr.contains("rerun with --seed 9"), "{stderr}");
    // The reconciler rolled back leases whose local transactions had committed: the records
    // are there and their claims are not, unless the cell's verifier created them again, which
    // no injected drift explains; either way the key's history is printed.
    assert!(
        stderr.contains("local record without its claim")
            || stderr.contains("verifier correction no drift explains"),
        "{stderr}"
    );
    assert!(stderr.contains("history of k"), "{stderr}");
}

#[test]
fn unknown_fault_names_are_refused_with_the_list_of_known_ones() {
    let dir = tempfile::tempdir().unwrap();
    let output = chaos(dir.path(), &["--faults", "server-kill,meteor-strike"]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("unknown fault \"meteor-strike\""),
        "{stderr}"
    );
    assert!(stderr.contains("proxy-reset"), "{stderr}");
}
