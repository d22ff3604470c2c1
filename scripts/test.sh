#!/usr/bin/env bash
# The one command that runs every test: unit, conformance + model-based suites against every
# backend (memory, SQLite, PostgreSQL, Spanner emulator), end-to-end tests through the real gRPC
# server and binary, the Prometheus alert-rule tests (promtool), and the Ruby gem's specs
# (clients/ruby/run-specs.sh). Needs PostgreSQL on
# 127.0.0.1:5432 (scripts/ensure-services.sh starts it).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-services.sh
# The Prometheus alert rules: syntax, then their unit tests (deploy/prometheus/alerts_test.yml).
promtool="${TOPOLOGY_CLAIMS_PROMTOOL:-promtool}"
if command -v "${promtool}" >/dev/null; then
  "${promtool}" check rules deploy/prometheus/alerts.yml
  "${promtool}" test rules deploy/prometheus/alerts_test.yml
else
  echo "promtool not found: alert rules NOT tested (set TOPOLOGY_CLAIMS_PROMTOOL)" >&2
  [ "${CI:-}" = "true" ] && exit 1
fi
# A failing test's output is repeated at the end (the last 80 lines of each), where the tail
# of a long CI log shows it.
cargo_log="$(mktemp)"
trap 'rm -f "${cargo_log}"' EXIT
if ! cargo test --workspace --all-features --no-fail-fast "$@" 2>&1 | tee "${cargo_log}"; then
  echo "== failed tests, the last 80 lines of each (the full output is above)" >&2
  awk '
    /^---- .* stdout ----$/ { flush(); name = $0; n = 0; next }
    /^failures:$/ || /^test result: / { flush(); next }
    name != "" { lines[n++] = $0 }
    function flush(  i) {
      if (name == "") return
      print name
      for (i = (n > 80 ? n - 80 : 0); i < n; i++) print lines[i]
      name = ""; n = 0
    }
    END { flush() }
  ' "${cargo_log}" >&2
  grep -A 20 -E "^error: [0-9]+ targets? failed" "${cargo_log}" >&2 || true
  exit 1
fi
# The Ruby gem's specs (clients/ruby), against the server binary cargo test just built.
TOPOLOGY_CLAIMS_BIN=target/debug/topology-claims clients/ruby/run-specs.sh
TOPOLOGY_CLAIMS_BIN="${TOPOLOGY_CLAIMS_BIN:-${CARGO_TARGET_DIR:-target}/debug/topology-claims}" deploy/test.sh  # deployment kit: image (release build), manifests, dashboard
