#!/usr/bin/env python3
"""Builds deploy/grafana/topology-claims.json with grafana-foundation-sdk's typed builders.

Edit the panels here, then run this script; `--check` writes nothing and exits 1 when the
committed JSON differs from what it would write (deploy/test.sh runs it, with the SDK round
trip and the live-metrics check in deploy/tests/check_dashboard.py).

Every panel links to the section of docs/operations.md that says what to do when it moves
(RUNBOOK below; the test checks that each anchor exists there). Queries use only the series
of docs/operations.md "Metrics"; the test scrapes a live server and sidecars for each name.
"""

import argparse
import json
import os
import sys

from grafana_foundation_sdk.builders import common, dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import LegendDisplayMode, LegendPlacement
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync, DataSourceRef, Threshold, ThresholdsMode, VariableRefresh)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import generated  # noqa: E402  (deploy/generated.py)

OUTPUT = os.path.join(HERE, "topology-claims.json")
# Where the runbooks are read: the repository's docs/operations.md on the default branch.
# --docs-base-url / TOPOLOGY_CLAIMS_DOCS_BASE_URL points the links at a fork or a mirror.
DEFAULT_DOCS_BASE = "https://github.com/topology-claims/topology-claims/blob/main/docs/operations.md"

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"


def link(docs_base, anchor, title):
    return (dashboard.DashboardLink(f"Runbook: {title}")
            .url(f"{docs_base}#{anchor}")
            .target_blank(True))


def query(expr, legend, ref="A"):
    return (prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref)
            .datasource(DATASOURCE).range())


def series(title, description, queries, unit, runbook, docs_base, width=12, thresholds=None):
    panel = (timeseries.Panel().title(title).description(description).datasource(DATASOURCE)
             .unit(unit).height(8).span(width).min(0).line_width(1).fill_opacity(10)
             .legend(common.VizLegendOptions().display_mode(LegendDisplayMode.LIST)
                     .placement(LegendPlacement.BOTTOM).show_legend(True))
             .links([link(docs_base, *runbook)]))
    for q in queries:
        panel = panel.with_target(q)
    if thresholds is not None:
        panel = panel.thresholds(
            dashboard.ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps([
                Threshold(value=None, color="green"),
                Threshold(value=thresholds, color="red"),
            ]))
    return panel


def single(title, description, q, unit, runbook, docs_base, red_below=None, width=6):
    steps = [Threshold(value=None, color="green")]
    if red_below is not None:
        steps = [Threshold(value=None, color="red"), Threshold(value=red_below, color="green")]
    return (stat.Panel().title(title).description(description).datasource(DATASOURCE)
            .unit(unit).height(8).span(width).with_target(q)
            .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
            .thresholds(dashboard.ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(steps))
            .links([link(docs_base, *runbook)]))


# (anchor in docs/operations.md, title)
ERRORS = ("runbook-errors", "error rate")
CONFLICTS = ("runbook-conflicts", "conflict rate")
STUCK = ("runbook-stuck-lease", "stuck lease")
STORE = ("runbook-store-unavailable", "store unavailable")
RATE_LIMITED = ("runbook-rate-limited", "rate limited")
AUDIT = ("runbook-audit-lines-lost", "audit lines lost")
RECONCILER = ("runbook-reconciler-down", "reconciler down")
SERVER_SERIES = ("server-series", "server series")
SIDECAR_SERIES = ("sidecar-series", "sidecar series")
SLOTS = ("runbook-verification-slots", "verifications waiting for a slot")
RESTORE = ("runbook-restore-quarantine", "restore quarantine")


def build(docs_base):
    builder = (
        dashboard.Dashboard("topology-claims")
        .uid("topology-claims")
        .description("The topology-claims servers and their cells' reconcile and verify "
                     "sidecars (docs/operations.md).")
        .tags(["topology-claims"])
        .refresh("30s")
        .time("now-6h", "now")
        .timezone("browser")
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .with_variable(dashboard.DatasourceVariable("datasource").label("Prometheus")
                       .type("prometheus"))
        .with_variable(dashboard.QueryVariable("cell_id").label("Cell").datasource(DATASOURCE)
                       .query("label_values(topology_claims_leases_outstanding, cell_id)")
                       .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
                       .multi(True).include_all(True).all_value(".*"))
        .link(dashboard.DashboardLink("Operations").url(docs_base).target_blank(True))
    )

    builder = builder.with_row(dashboard.Row("Requests"))
    builder = builder.with_panel(series(
        "Requests by method and code",
        "topology_claims_requests_total: requests answered per second, by RPC and gRPC code.",
        [query(f"sum by (method, code) (rate(topology_claims_requests_total[{RATE}]))",
               "{{method}} {{code}}")],
        "reqps", ERRORS, docs_base))
    builder = builder.with_panel(series(
        "Errors by method and code",
        "Requests that ended INTERNAL, UNAVAILABLE, UNKNOWN or DEADLINE_EXCEEDED, per second "
        "(TopologyClaimsHighErrorRate fires at 5% of all requests).",
        [query("sum by (method, code) (rate(topology_claims_requests_total"
               f'{{code=~"INTERNAL|UNAVAILABLE|UNKNOWN|DEADLINE_EXCEEDED"}}[{RATE}]))',
               "{{method}} {{code}}")],
        "reqps", ERRORS, docs_base))
    builder = builder.with_panel(series(
        "Latency quantiles by method",
        "From topology_claims_request_duration_seconds: p50, p90 and p99. p99 up with store "
        "retries: store contention; without: the store or the host is slow.",
        [query(f"histogram_quantile({q}, sum by (le, method) "
               f"(rate(topology_claims_request_duration_seconds_bucket[{RATE}])))",
               f"p{int(q * 100)} {{{{method}}}}", ref)
         for q, ref in [(0.5, "A"), (0.9, "B"), (0.99, "C")]],
        "s", SERVER_SERIES, docs_base, width=24))

    builder = builder.with_row(dashboard.Row("Conflicts"))
    builder = builder.with_panel(series(
        "Claim conflicts by reason",
        "topology_claims_claim_conflicts_total: BeginUpdates refused by a claim, per second.",
        [query(f"sum by (reason) (rate(topology_claims_claim_conflicts_total[{RATE}]))",
               "{{reason}}")],
        "reqps", CONFLICTS, docs_base))
    builder = builder.with_panel(series(
        "Conflicts per BeginUpdate",
        "Conflicts over BeginUpdate calls (TopologyClaimsHighConflictRate fires over 20%).",
        [query(f"sum(rate(topology_claims_claim_conflicts_total[{RATE}])) / "
               f'(sum(rate(topology_claims_requests_total{{method="BeginUpdate"}}[{RATE}])) > 0)',
               "conflicts / BeginUpdate")],
        "percentunit", CONFLICTS, docs_base, thresholds=0.2))

    builder = builder.with_row(dashboard.Row("Leases"))
    builder = builder.with_panel(series(
        "Outstanding leases per cell",
        "topology_claims_leases_outstanding (store-wide, reported by every replica: max by cell).",
        [query('max by (cell_id) (topology_claims_leases_outstanding{cell_id=~"$cell_id"})',
               "{{cell_id}}")],
        "short", STUCK, docs_base))
    builder = builder.with_panel(series(
        "Oldest lease age per cell",
        "topology_claims_oldest_lease_age_seconds (store clock). Over 600 s (the reconciler's "
        "staleness) for 2m: TopologyClaimsStaleLease.",
        [query('max by (cell_id) (topology_claims_oldest_lease_age_seconds{cell_id=~"$cell_id"})',
               "{{cell_id}}")],
        "s", STUCK, docs_base, thresholds=600))

    builder = builder.with_row(dashboard.Row("Store"))
    builder = builder.with_panel(single(
        "Store up (worst replica)",
        "topology_claims_store_up: 1 when the last lease-summary read of the store worked.",
        query("min(topology_claims_store_up)", "store up"),
        "short", STORE, docs_base, red_below=1))
    builder = builder.with_panel(single(
        "Lease gauges age",
        "Seconds since the lease gauges were last read from the store "
        "(topology_claims_lease_gauges_refreshed_timestamp_seconds); far behind: the read fails.",
        query("time() - max(topology_claims_lease_gauges_refreshed_timestamp_seconds)", "age"),
        "s", STORE, docs_base))
    builder = builder.with_panel(series(
        "Store retries",
        "topology_claims_store_retries_total: store transactions retried (serialization "
        "failures, deadlocks, aborts, reconnects), per second.",
        [query(f"sum by (instance) (rate(topology_claims_store_retries_total[{RATE}]))",
               "{{instance}}")],
        "ops", SERVER_SERIES, docs_base))
    builder = builder.with_panel(series(
        "Group sizes",
        "topology_claims_group_commit_batch_size: calls per group-commit store transaction, "
        "mean and p90. Near 1 under load: the store keeps up; near --group-max: it is the "
        "bottleneck.",
        [query(f"sum(rate(topology_claims_group_commit_batch_size_sum[{RATE}])) / "
               f"(sum(rate(topology_claims_group_commit_batch_size_count[{RATE}])) > 0)",
               "mean", "A"),
         query("histogram_quantile(0.9, sum by (le) "
               f"(rate(topology_claims_group_commit_batch_size_bucket[{RATE}])))", "p90", "B")],
        "short", SERVER_SERIES, docs_base))
    builder = builder.with_panel(series(
        "Versions running",
        "topology_claims_build_info: servers per version; two at once is a rolling upgrade.",
        [query("count by (version) (topology_claims_build_info)", "{{version}}")],
        "short", SERVER_SERIES, docs_base))

    builder = builder.with_panel(single(
        "Restore quarantine",
        "topology_claims_restore_quarantine: 1 while a restored store refuses creates of absent "
        "claims (RESTORE_QUARANTINE) until every cell re-verifies; "
        "topology_claims_restore_cells_pending: the cells it waits for; "
        "topology_claims_restore_epoch: the latest restore (0: never).",
        query("max(topology_claims_restore_quarantine)", "quarantined"),
        "short", RESTORE, docs_base))
    builder = builder.with_panel(series(
        "Restore: epoch and cells pending",
        "topology_claims_restore_epoch steps at each `admin mark-restored`; "
        "topology_claims_restore_cells_pending counts down as the cells' verifiers report their "
        "passes (TopologyClaimsRestoreQuarantine fires after 1h).",
        [query("max(topology_claims_restore_epoch)", "epoch", "A"),
         query("max(topology_claims_restore_cells_pending)", "cells pending", "B")],
        "short", RESTORE, docs_base, width=18))

    builder = builder.with_row(dashboard.Row("Limits and audit"))
    builder = builder.with_panel(series(
        "Rate-limited calls per cell",
        "topology_claims_rate_limited_total: requests refused by --cell-rate / "
        "--cell-max-in-flight, per second.",
        [query("sum by (cell_id) (rate(topology_claims_rate_limited_total"
               f'{{cell_id=~"$cell_id"}}[{RATE}]))', "{{cell_id}}")],
        "reqps", RATE_LIMITED, docs_base))
    builder = builder.with_panel(series(
        "Audit lines lost",
        "Audit lines that could not be written (topology_claims_audit_write_failures_total) or "
        "were dropped from a full queue (topology_claims_audit_lines_dropped_total), per 5m.",
        [query("sum by (instance) (increase(topology_claims_audit_write_failures_total[5m]))",
               "write failures {{instance}}", "A"),
         query("sum by (instance) (increase(topology_claims_audit_lines_dropped_total[5m]))",
               "dropped {{instance}}", "B")],
        "short", AUDIT, docs_base, thresholds=1))

    builder = builder.with_row(dashboard.Row("Sidecars: reconcile and verify"))
    builder = builder.with_panel(series(
        "Reconcile: since last success",
        "Seconds since each cell's last successful reconcile pass "
        "(topology_claims_reconcile_last_success_timestamp_seconds); over 600: "
        "TopologyClaimsReconcilerNotSucceeding.",
        [query("time() - max by (cell_id) (topology_claims_reconcile_last_success_timestamp_seconds"
               '{cell_id=~"$cell_id"})', "{{cell_id}}")],
        "s", RECONCILER, docs_base, thresholds=600))
    builder = builder.with_panel(series(
        "Reconcile: leases ended and errors",
        "Leases the reconcilers committed or rolled back (topology_claims_reconcile_leases_total), "
        "and leases they could not end plus failed passes (topology_claims_reconcile_errors_total), "
        "per 10m.",
        [query("sum by (cell_id, outcome) (increase(topology_claims_reconcile_leases_total"
               '{cell_id=~"$cell_id"}[10m]))', "{{cell_id}} {{outcome}}", "A"),
         query("sum by (cell_id) (increase(topology_claims_reconcile_errors_total"
               '{cell_id=~"$cell_id"}[10m]))', "{{cell_id}} errors", "B"),
         query("sum by (cell_id, result) (increase(topology_claims_reconcile_passes_total"
               '{cell_id=~"$cell_id"}[10m]))', "{{cell_id}} passes {{result}}", "C")],
        "short", RECONCILER, docs_base))
    builder = builder.with_panel(series(
        "Verify: since last complete run",
        "Seconds since each cell's last complete verify run "
        "(topology_claims_verify_last_completed_timestamp_seconds), and runs by result "
        "(topology_claims_verify_runs_total). Waiting runs: verification slots.",
        [query("time() - max by (cell_id) (topology_claims_verify_last_completed_timestamp_seconds"
               '{cell_id=~"$cell_id"})', "{{cell_id}}", "A")],
        "s", SLOTS, docs_base))
    builder = builder.with_panel(series(
        "Verify: records, discrepancies and corrections",
        "Per 1h: records compared (topology_claims_verify_records_checked_total), differences "
        "found by kind (topology_claims_verify_discrepancies_total), corrections applied or "
        "failed (topology_claims_verify_corrections_total; failed ones need a human), runs by "
        "result (topology_claims_verify_runs_total).",
        [query("sum by (cell_id) (increase(topology_claims_verify_records_checked_total"
               '{cell_id=~"$cell_id"}[1h]))', "{{cell_id}} checked", "A"),
         query("sum by (cell_id, kind) (increase(topology_claims_verify_discrepancies_total"
               '{cell_id=~"$cell_id"}[1h]))', "{{cell_id}} {{kind}}", "B"),
         query("sum by (cell_id, result) (increase(topology_claims_verify_corrections_total"
               '{cell_id=~"$cell_id"}[1h]))', "{{cell_id}} corrections {{result}}", "C"),
         query("sum by (cell_id, result) (increase(topology_claims_verify_runs_total"
               '{cell_id=~"$cell_id"}[1h]))', "{{cell_id}} runs {{result}}", "D")],
        "short", SIDECAR_SERIES, docs_base))
    return builder.build()


def render(docs_base):
    return json.dumps(build(docs_base), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if the committed JSON is out of date")
    parser.add_argument("--docs-base-url",
                        default=os.environ.get("TOPOLOGY_CLAIMS_DOCS_BASE_URL", DEFAULT_DOCS_BASE),
                        help="URL of docs/operations.md the runbook links point to (env "
                             f"TOPOLOGY_CLAIMS_DOCS_BASE_URL; default {DEFAULT_DOCS_BASE})")
    args = parser.parse_args()
    return generated.write_or_check(OUTPUT, render(args.docs_base_url),
                                    "deploy/grafana/build_dashboard.py", args.check)

if __name__ == "__main__":
    sys.exit(main())
