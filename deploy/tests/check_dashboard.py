#!/usr/bin/env python3
"""Checks deploy/grafana/topology-claims.json (run by deploy/test.sh).

1. It is what deploy/grafana/build_dashboard.py builds (no hand edits that the code lost).
2. It round-trips through grafana-foundation-sdk's typed models (with the panel and query
   plugins registered) unchanged: a misspelled or unknown key is dropped by the SDK and fails.
3. Every panel links to a section of docs/operations.md that exists.
4. Every metric name its queries use is exported by a LIVE process: this starts the real
   `topology-claims serve` (SQLite, loopback, plaintext) and the `reconcile` and `verify`
   sidecars with --metrics-listen, makes the traffic that brings every labelled series into
   being (a commit, a conflict, an outstanding lease, a rate-limited cell, a sidecar pass and
   a verify run), scrapes the three /metrics endpoints and compares.

Usage: check_dashboard.py --binary PATH (default $TOPOLOGY_CLAIMS_BIN, else
target/debug/topology-claims). Exit status 0 when all pass, 1 with every failure listed.
"""

import argparse
import copy
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid

import grpc
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models.dashboard import Dashboard

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "deploy", "grafana"))
import build_dashboard  # noqa: E402
import grpc_probe  # noqa: E402
from report import check, fail, failures  # noqa: E402

DASHBOARD = os.path.join(REPO, "deploy", "grafana", "topology-claims.json")
OPERATIONS = os.path.join(REPO, "docs", "operations.md")
METRIC = re.compile(r"\btopology_claims_[a-z0-9_]+\b")
# How long a live process gets to print its address or to bring a series into being.
WAIT_SECONDS = float(os.environ.get("TOPOLOGY_CLAIMS_DEPLOY_WAIT_SECONDS", "30"))



def round_trip(data):
    return json.loads(json.dumps(Dashboard.from_json(data), cls=JSONEncoder))


def check_static(data):
    with open(DASHBOARD, encoding="utf-8") as f:
        committed = f.read()
    check(committed == build_dashboard.render(build_dashboard.DEFAULT_DOCS_BASE),
          "deploy/grafana/topology-claims.json differs from what deploy/grafana/build_dashboard.py "
          "builds: run the script (and edit panels there, not in the JSON)")
    register_default_plugins()
    check(round_trip(data) == data,
          "the dashboard does not round-trip through grafana-foundation-sdk unchanged")
    # The round trip must be able to fail: a misspelled key in a query is dropped.
    broken = copy.deepcopy(data)
    panel = next(p for p in broken["panels"] if p.get("targets"))
    panel["targets"][0]["legendFromat"] = panel["targets"][0].pop("legendFormat")
    check(round_trip(broken) != broken,
          "self-test: a misspelled key (legendFromat) survived the SDK round trip")

    with open(OPERATIONS, encoding="utf-8") as f:
        operations = f.read()
    anchors = set(re.findall(r'<a id="([^"]+)"', operations))
    for heading in re.findall(r"^#+ (.+)$", operations, flags=re.M):
        anchors.add(re.sub(r"[^a-z0-9 _-]", "", heading.lower()).replace(" ", "-"))
    panels = [p for p in data["panels"] if p["type"] != "row"]
    check(len(panels) >= 10, f"the dashboard has only {len(panels)} panels")
    for p in panels:
        links = [link["url"] for link in p.get("links", [])]
        ok = [u for u in links if "docs/operations.md#" in u and u.split("#", 1)[1] in anchors]
        check(ok, f"panel {p['title']!r} links to no existing section of docs/operations.md: {links}")


def used_metrics(data):
    exprs = [t["expr"] for p in data["panels"] for t in p.get("targets", [])]
    exprs += [v.get("query", "") for v in data.get("templating", {}).get("list", [])
              if isinstance(v.get("query", ""), str)]
    return {m for e in exprs for m in METRIC.findall(e)}


class Live:
    """A process that prints `listening on` / `metrics on` lines to stdout."""

    def __init__(self, name, argv, workdir):
        self.name = name
        self.stdout_path = os.path.join(workdir, f"{name}.stdout")
        self.stderr_path = os.path.join(workdir, f"{name}.stderr")
        self.proc = subprocess.Popen(argv, stdout=open(self.stdout_path, "w"),
                                     stderr=open(self.stderr_path, "w"), cwd=workdir)

    def address(self, prefix):
        deadline = time.time() + WAIT_SECONDS
        while time.time() < deadline:
            with open(self.stdout_path) as f:
                for line in f:
                    if line.startswith(prefix):
                        return line[len(prefix):].strip()
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        with open(self.stderr_path) as f:
            tail = f.read()[-2000:]
        raise RuntimeError(f"{self.name} printed no `{prefix}` line within {WAIT_SECONDS}s "
                           f"(exit status {self.proc.poll()}); stderr:\n{tail}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def scrape(address):
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        return response.read().decode()


def sample_names(text):
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines()
            if line and not line.startswith("#")}


def wait_for(address, pattern, what):
    deadline = time.time() + WAIT_SECONDS
    while time.time() < deadline:
        if re.search(pattern, scrape(address), flags=re.M):
            return
        time.sleep(0.25)
    raise RuntimeError(f"{what}: no {pattern!r} at http://{address}/metrics within {WAIT_SECONDS}s")


def traffic(target):
    """The calls that bring every labelled server series into being."""
    pb, pb_grpc = grpc_probe.claims_stubs()
    stub = pb_grpc.ClaimsServiceStub(grpc.insecure_channel(target))

    def claim(value):
        return pb.ClaimRecord(claim_type=pb.ClaimRecord.CLAIM_TYPE_EMAIL, claim_value=value,
                              owner=pb.ClaimRecord.OWNER_USER, owner_value="1",
                              table_name=pb.ClaimRecord.TABLE_NAME_EMAILS, table_record_id=1)

    def begin(value):
        lease = str(uuid.uuid4())
        stub.BeginUpdate(pb.BeginUpdateRequest(cell_id="cell-1", creates_claims=[claim(value)],
                                               lease_id=lease), timeout=10)
        return lease

    stub.CommitUpdate(pb.CommitUpdateRequest(cell_id="cell-1", lease_id=begin("a@example.com")),
                      timeout=10)
    try:
        begin("a@example.com")
        raise RuntimeError("a second BeginUpdate of a@example.com was not refused CLAIM_TAKEN")
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.ALREADY_EXISTS:
            raise
    begin("outstanding@example.com")  # left outstanding: the lease gauges
    for _ in range(50):  # a cell over --cell-rate: rate_limited_total
        try:
            stub.ListOutstandingLeases(pb.ListOutstandingLeasesRequest(cell_id="cell-flood"),
                                       timeout=10)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                return
            raise
    raise RuntimeError("50 calls of cell-flood were never refused by --cell-rate")


def live_metric_names(binary, workdir):
    procs = []
    try:
        server = Live("serve", [binary, "serve", "--listen", "127.0.0.1:0",
                                "--metrics-listen", "127.0.0.1:0",
                                "--store", f"sqlite://{workdir}/claims.db",
                                "--metrics-refresh-interval", "500ms",
                                "--cell-rate", "5", "--cell-burst", "20"], workdir)
        procs.append(server)
        grpc_addr = server.address("listening on ")
        server_metrics = server.address("metrics on ")
        traffic(grpc_addr)

        db = sqlite3.connect(os.path.join(workdir, "cell-2.db"))
        db.execute("CREATE TABLE emails (id INTEGER PRIMARY KEY, email TEXT, user_id INTEGER, "
                   "created_at INTEGER)")
        db.execute("INSERT INTO emails VALUES (1, 'verified@example.com', 7, 1000000000)")
        db.commit()
        db.close()
        with open(os.path.join(workdir, "verify.toml"), "w") as f:
            f.write('[tables.emails]\nquery = """\nSELECT id, \'email\', email, \'user\', '
                    'CAST(user_id AS TEXT), created_at FROM emails WHERE id >= ?1 AND id < ?2\n"""\n')
        server_url = f"http://{grpc_addr}"
        reconcile = Live("reconcile", [binary, "reconcile", "--server", server_url,
                                       "--cell-id", "cell-1", "--local-db",
                                       f"sqlite://{workdir}/cell-1.db", "--interval", "1s",
                                       "--metrics-listen", "127.0.0.1:0"], workdir)
        procs.append(reconcile)
        verify = Live("verify", [binary, "verify", "--server", server_url, "--cell-id", "cell-2",
                                 "--local-db", f"sqlite://{workdir}/cell-2.db",
                                 "--source", f"{workdir}/verify.toml", "--every", "1h",
                                 "--metrics-listen", "127.0.0.1:0"], workdir)
        procs.append(verify)
        reconcile_metrics = reconcile.address("metrics on ")
        verify_metrics = verify.address("metrics on ")

        wait_for(server_metrics, r"^topology_claims_leases_outstanding\{", "serve")
        wait_for(server_metrics, r"^topology_claims_rate_limited_total\{", "serve")
        wait_for(reconcile_metrics, r"^topology_claims_reconcile_last_success_timestamp_seconds\{",
                 "reconcile")
        wait_for(verify_metrics, r"^topology_claims_verify_last_completed_timestamp_seconds\{",
                 "verify")
        names = {}
        for name, address in [("serve", server_metrics), ("reconcile", reconcile_metrics),
                              ("verify", verify_metrics)]:
            names[name] = sample_names(scrape(address))
        return names
    finally:
        for p in reversed(procs):
            p.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--binary", default=os.environ.get(
        "TOPOLOGY_CLAIMS_BIN", os.path.join(REPO, "target", "debug", "topology-claims")),
        help="the topology-claims binary to run (env TOPOLOGY_CLAIMS_BIN; default "
             "target/debug/topology-claims)")
    args = parser.parse_args()
    # Absolute: the processes run in a temporary directory of their own.
    args.binary = os.path.abspath(args.binary)
    with open(DASHBOARD, encoding="utf-8") as f:
        data = json.load(f)
    check_static(data)

    if not os.access(args.binary, os.X_OK):
        fail(f"the binary {args.binary} does not exist or is not executable "
             f"(--binary / TOPOLOGY_CLAIMS_BIN): the live metrics cannot be checked")
        return 1
    with tempfile.TemporaryDirectory(prefix="topology-claims-dashboard.") as workdir:
        try:
            live = live_metric_names(args.binary, workdir)
        except (RuntimeError, grpc.RpcError, OSError) as e:
            fail(f"live metrics: {e}")
            return 1
    exported = set().union(*live.values())
    used = used_metrics(data)
    check(len(used) >= 20, f"the dashboard's queries use only {len(used)} metric names")
    check("topology_claims_renamed_series_total" not in exported,
          "self-test: a made-up series is reported as exported")
    for name in sorted(used - exported):
        fail(f"the dashboard queries {name}, which no live process exports "
             f"(serve, reconcile, verify /metrics)")
    unused = sorted({n for n in exported if n.startswith("topology_claims_")} - used
                    - {n + s for n in used for s in ("_bucket", "_sum", "_count")})
    if failures:
        print(f"dashboard: {len(failures)} failure(s)", file=sys.stderr)
        return 1
    print(f"dashboard: {len([p for p in data['panels'] if p['type'] != 'row'])} panels, "
          f"{len(used)} metric names, all exported by live serve/reconcile/verify; "
          f"round-trips through grafana-foundation-sdk; runbook links resolve"
          + (f"; exported but not shown: {', '.join(unused)}" if unused else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
