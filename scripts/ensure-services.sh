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
# curl: cli/tests/rest.rs calls the REST lookups with it, over HTTP/1.1 and HTTP/2, with mTLS.
if command -v curl >/dev/null; then
  echo "curl: $(command -v curl)"
else
  echo "curl: not found; trying apt-get install curl"
  (export DEBIAN_FRONTEND=noninteractive
   apt-get update -qq && apt-get install -y -qq -o DPkg::Lock::Timeout=300 curl) >/dev/null 2>&1 || true
  if command -v curl >/dev/null; then
    echo "curl: installed"
  else
    echo "curl: missing (install curl)" >&2
    [ "${CI:-}" = "true" ] && exit 1
  fi
fi
# --- Ruby gem (clients/ruby) -------------------------------------------------------------------
# clients/ruby/run-specs.sh (called by scripts/test.sh) runs the gem's RSpec suite with Debian's
# Ruby packages (no rubygems.org). Installs the missing ones; under CI=true a package still
# missing afterwards fails this script.
ruby_packages="ruby ruby-grpc ruby-grpc-tools ruby-google-protobuf ruby-googleapis-common-protos-types ruby-activerecord ruby-sqlite3 ruby-pg ruby-rspec ruby-railties ruby-rack-test"
# The packages of "$@" that are not installed.
ruby_not_installed() {
  for package in "$@"; do
    dpkg-query -W -f='${Status}' "${package}" 2>/dev/null | grep -q "install ok installed" \
      || printf ' %s' "${package}"
  done
}
# shellcheck disable=SC2086 # word splitting of the package lists is intended
ruby_missing="$(ruby_not_installed ${ruby_packages})"
if [ -z "${ruby_missing}" ]; then
  echo "ruby packages: installed"
else
  echo "ruby packages: missing${ruby_missing}; trying apt-get install"
  (export DEBIAN_FRONTEND=noninteractive
   apt-get update -qq && apt-get install -y -qq -o DPkg::Lock::Timeout=300 ${ruby_missing}) >/dev/null 2>&1 || true
  ruby_missing="$(ruby_not_installed ${ruby_missing})"
  if [ -z "${ruby_missing}" ]; then
    echo "ruby packages: installed"
  else
    echo "ruby packages: missing${ruby_missing} (apt-get install them)" >&2
    [ "${CI:-}" = "true" ] && exit 1
  fi
fi
# --- end of the Ruby gem block -------------------------------------------------------------------
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
  # Pinned: the versions the kit was tested with (grafana-foundation-sdk's version has an epoch).
  python3 -m pip install -q grpcio==1.85.3 grpcio-tools==1.85.1 grpcio-health-checking==1.85.1 \
    kubernetes-validate==1.37.0 'grafana-foundation-sdk==1769699998!10.1.0' >/dev/null 2>&1 || true
fi
if python3 -c "${deploy_python_check}" 2>/dev/null; then
  echo "deploy kit: Python tools present"
else
  echo "deploy kit: Python tools missing (pip install grpcio grpcio-tools grpcio-health-checking kubernetes-validate grafana-foundation-sdk)" >&2
  [ "${CI:-}" = "true" ] && exit 1
fi
# --- end of the deployment kit block ----------------------------------------------------------
exit 0
