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
cargo test --workspace --all-features --no-fail-fast "$@"
# The Ruby gem's specs (clients/ruby), against the server binary cargo test just built.
TOPOLOGY_CLAIMS_BIN=target/debug/topology-claims clients/ruby/run-specs.sh
TOPOLOGY_CLAIMS_BIN="${TOPOLOGY_CLAIMS_BIN:-${CARGO_TARGET_DIR:-target}/debug/topology-claims}" deploy/test.sh  # deployment kit: image (release build), manifests, dashboard
