#!/usr/bin/env bash
# The one command that runs every test: unit, conformance + model-based suites against every
# backend (memory, SQLite, PostgreSQL, Spanner emulator), end-to-end tests through the real gRPC
# server and binary. Needs PostgreSQL on 127.0.0.1:5432 (scripts/ensure-services.sh starts it).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-services.sh
cargo test --workspace --all-features --no-fail-fast "$@"
