#!/usr/bin/env bash
# Runs the Ruby gem's whole RSpec suite (SQLite and PostgreSQL cells, against the real server
# from $TOPOLOGY_CLAIMS_BIN, default <repo>/target/debug/topology-claims). Exits non-zero on a
# failure. Without ruby or one of the Debian packages it says which and skips, except under
# CI=true, where it fails (scripts/ensure-services.sh installs them).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "${here}/../.." && pwd)"
export TOPOLOGY_CLAIMS_BIN="${TOPOLOGY_CLAIMS_BIN:-${repo}/target/debug/topology-claims}"
case "${TOPOLOGY_CLAIMS_BIN}" in /*) ;; *) TOPOLOGY_CLAIMS_BIN="${repo}/${TOPOLOGY_CLAIMS_BIN}" ;; esac

missing() {
  echo "ruby specs: $1 missing; NOT run (scripts/ensure-services.sh installs it)" >&2
  if [ "${CI:-}" = "true" ]; then exit 1; fi
  exit 0
}
command -v ruby >/dev/null || missing "ruby"
command -v rspec >/dev/null || missing "rspec (ruby-rspec)"
for lib in grpc google/protobuf google/rpc/error_details_pb active_record sqlite3 pg; do
  ruby -e "require '${lib}'" 2>/dev/null || missing "the Ruby library ${lib}"
done
command -v "${TOPOLOGY_CLAIMS_PROTOC:-grpc_tools_ruby_protoc}" >/dev/null || missing "grpc_tools_ruby_protoc (ruby-grpc-tools; or set TOPOLOGY_CLAIMS_PROTOC)"
[ -x "${TOPOLOGY_CLAIMS_BIN}" ] || { echo "ruby specs: TOPOLOGY_CLAIMS_BIN=${TOPOLOGY_CLAIMS_BIN} is not an executable" >&2; exit 1; }

cd "${here}"
exec rspec --format progress "$@"
