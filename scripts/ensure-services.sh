#!/usr/bin/env bash
# Makes sure what the test suite talks to is there: a running PostgreSQL (started if it is down),
# the Cloud Spanner emulator binary, etcd (the benchmark's baseline), promtool (the alert-rule
# tests) and strace (the SQLite durability test). Idempotent; safe to run before every test run.
set -euo pipefail

pg_url="${TOPOLOGY_CLAIMS_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}"

if command -v pg_isready >/dev/null && pg_isready -q -h 127.0.0.1 -p 5432; then
  echo "postgresql: running"
else
  if command -v pg_ctlcluster >/dev/null; then
    version="$(ls /etc/postgresql 2>/dev/null | sort -n | tail -n 1)"
    version="${version:-15}"
    echo "postgresql: down, starting cluster ${version}/main"
    pg_ctlcluster --skip-systemctl-redirect "${version}" main start || true
    for _ in $(seq 1 30); do
      pg_isready -q -h 127.0.0.1 -p 5432 && break
      sleep 1
    done
  fi
  if pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
    echo "postgresql: started"
  else
    echo "postgresql: NOT reachable at 127.0.0.1:5432 (tests use ${pg_url})" >&2
    [ "${CI:-}" = "true" ] && exit 1
  fi
fi

emulator="${TOPOLOGY_CLAIMS_SPANNER_EMULATOR:-/usr/lib/google-cloud-sdk/bin/cloud_spanner_emulator/emulator_main}"
if [ -x "${emulator}" ]; then
  echo "spanner emulator: ${emulator}"
else
  echo "spanner emulator: not found at ${emulator}; trying apt-get install google-cloud-cli-spanner-emulator"
  (apt-get update -qq && apt-get install -y -qq google-cloud-cli-spanner-emulator) >/dev/null 2>&1 || true
  if [ -x "${emulator}" ]; then
    echo "spanner emulator: installed"
  else
    echo "spanner emulator: missing (set TOPOLOGY_CLAIMS_SPANNER_EMULATOR to its path)" >&2
    [ "${CI:-}" = "true" ] && exit 1
  fi
fi
# etcd: the benchmark's etcd baseline (`topology-claims-bench --baselines etcd`, and its smoke
# test under CI=true) starts Debian's etcd itself on loopback ports.
etcd_bin="${TOPOLOGY_CLAIMS_BENCH_ETCD_BIN:-etcd}"
if command -v "${etcd_bin}" >/dev/null; then
  echo "etcd: $(command -v "${etcd_bin}")"
else
  echo "etcd: not found; trying apt-get install etcd-server"
  (apt-get update -qq && apt-get install -y -qq etcd-server) >/dev/null 2>&1 || true
  if command -v "${etcd_bin}" >/dev/null; then
    echo "etcd: installed"
  else
    echo "etcd: missing (install etcd-server or set TOPOLOGY_CLAIMS_BENCH_ETCD_BIN)" >&2
    [ "${CI:-}" = "true" ] && exit 1
  fi
fi
# promtool: scripts/test.sh checks and unit-tests the Prometheus alert rules
# (deploy/prometheus/alerts.yml, alerts_test.yml) with it. Debian ships it in the prometheus
# package, whose postinst may try to start a Prometheus server (on :9090); that does not matter
# here, and a failing postinst does not fail this script.
promtool_bin="${TOPOLOGY_CLAIMS_PROMTOOL:-promtool}"
if command -v "${promtool_bin}" >/dev/null; then
  echo "promtool: $(command -v "${promtool_bin}")"
else
  echo "promtool: not found; trying apt-get install prometheus"
  (export DEBIAN_FRONTEND=noninteractive
   apt-get update -qq && apt-get install -y -qq -o DPkg::Lock::Timeout=300 prometheus) >/dev/null 2>&1 || true
  if command -v "${promtool_bin}" >/dev/null; then
    echo "promtool: installed"
  else
    echo "promtool: missing (install prometheus or set TOPOLOGY_CLAIMS_PROMTOOL)" >&2
    [ "${CI:-}" = "true" ] && exit 1
  fi
fi
# strace: cli/tests/sqlite_durability.rs counts the server's fsync/fdatasync calls with it.
if command -v strace >/dev/null; then
  echo "strace: $(command -v strace)"
else
  echo "strace: not found; trying apt-get install strace"
  (export DEBIAN_FRONTEND=noninteractive
   apt-get update -qq && apt-get install -y -qq -o DPkg::Lock::Timeout=300 strace) >/dev/null 2>&1 || true
  if command -v strace >/dev/null; then
    echo "strace: installed"
  else
    echo "strace: missing (install strace)" >&2
    [ "${CI:-}" = "true" ] && exit 1
  fi
fi
# --- deployment kit (deploy/test.sh): podman, runc, debootstrap, and the Python tools -------
# deploy/test.sh builds the image with podman (runc, deploy/container/containers.conf) on a
# Debian base made by debootstrap when no registry is reachable, talks gRPC to it from the host
# (grpcio, grpcio-tools: stubs generated from proto/ at run time, grpcio-health-checking),
# validates the manifests (kubernetes-validate; jsonschema and PyYAML come with it) and
# round-trips the dashboard (grafana-foundation-sdk). kubectl (kustomize) must be installed.
deploy_missing=()
for tool in podman runc debootstrap; do
  command -v "${tool}" >/dev/null || deploy_missing+=("${tool}")
done
if [ ${#deploy_missing[@]} -gt 0 ]; then
  echo "deploy kit: ${deploy_missing[*]} not found; trying apt-get install podman runc debootstrap"
  (export DEBIAN_FRONTEND=noninteractive
   apt-get update -qq && apt-get install -y -qq -o DPkg::Lock::Timeout=300 podman runc debootstrap) \
    >/dev/null 2>&1 || true
fi
for tool in podman runc debootstrap kubectl; do
  if command -v "${tool}" >/dev/null; then
    echo "deploy kit: ${tool}: $(command -v "${tool}")"
  else
    echo "deploy kit: ${tool} missing (install it; kubectl from the Kubernetes apt repository)" >&2
    [ "${CI:-}" = "true" ] && exit 1
  fi
done
deploy_python_check='import grpc, grpc_tools, grpc_health.v1, kubernetes_validate, jsonschema, yaml, grafana_foundation_sdk'
if ! python3 -c "${deploy_python_check}" 2>/dev/null; then
  echo "deploy kit: installing the Python tools (pip)"
  python3 -m pip install -q grpcio grpcio-tools grpcio-health-checking kubernetes-validate \
    grafana-foundation-sdk >/dev/null 2>&1 || true
fi
if python3 -c "${deploy_python_check}" 2>/dev/null; then
  echo "deploy kit: Python tools present"
else
  echo "deploy kit: Python tools missing (pip install grpcio grpcio-tools grpcio-health-checking kubernetes-validate grafana-foundation-sdk)" >&2
  [ "${CI:-}" = "true" ] && exit 1
fi
# --- end of the deployment kit block ----------------------------------------------------------
exit 0
