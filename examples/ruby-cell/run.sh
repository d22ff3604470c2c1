#!/usr/bin/env bash
# A runnable Ruby cell, in one command: starts `topology-claims serve` (memory store, a free
# loopback port), runs signup.rb (two cells, each with its own SQLite database, ActiveRecord
# models with TopologyClaims::Claimable), then the two sidecars against the first cell's
# database with the gem's verify.toml. Needs Debian's ruby packages (scripts/ensure-services.sh)
# and the binary: $TOPOLOGY_CLAIMS_BIN, else target/debug or target/release, else the PATH's.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
# The binary: $TOPOLOGY_CLAIMS_BIN, else a debug build, else a release build, else the PATH's.
bin="${TOPOLOGY_CLAIMS_BIN:-}"
if [ -z "${bin}" ]; then
  for candidate in "${repo}/target/debug/topology-claims" "${repo}/target/release/topology-claims" \
                   "$(command -v topology-claims || true)"; do
    if [ -n "${candidate}" ] && [ -x "${candidate}" ]; then bin="${candidate}"; break; fi
  done
fi
[ -n "${bin}" ] || { echo "run.sh: no topology-claims binary: cargo build (or set TOPOLOGY_CLAIMS_BIN)" >&2; exit 1; }
work="$(mktemp -d)"
trap 'kill "${server_pid}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "${work}"' EXIT

"${bin}" serve --listen 127.0.0.1:0 --store memory: >"${work}/serve.out" 2>"${work}/serve.err" &
server_pid=$!
for _ in $(seq 100); do grep -q "listening on" "${work}/serve.out" 2>/dev/null && break; sleep 0.1; done
address="$(sed -n 's/^listening on //p' "${work}/serve.out")"
[ -n "${address}" ] || { cat "${work}/serve.err" >&2; exit 1; }
echo "== topology-claims serve on ${address}"

export TOPOLOGY_CLAIMS_SERVER="http://${address}" TOPOLOGY_CLAIMS_CELL_ID=cell-eu
ruby -I"${repo}/clients/ruby/lib" "${repo}/examples/ruby-cell/signup.rb" "${work}"

echo "== topology-claims reconcile --once (cell-eu)"
"${bin}" reconcile --once --local-db "sqlite://${work}/cell-eu.sqlite3"
echo "== topology-claims verify (cell-eu, with TopologyClaims.verify_toml)"
"${bin}" verify --local-db "sqlite://${work}/cell-eu.sqlite3" --source "${work}/verify.toml" \
  --recent 0s --cursor-file "${work}/verify.cursor"
