#!/usr/bin/env bash
# The deployment kit's tests, offline (scripts/test.sh runs them; scripts/ensure-services.sh
# installs what they need):
#   image      deploy/container/build.sh builds the image from a release build; podman runs it:
#              it refuses plaintext by default, prints `listening on` with mTLS, answers gRPC
#              health SERVING from the host, keeps a BeginUpdate + CommitUpdate on its volume
#              across a restart, runs as a non-root user, exits 0 on SIGTERM, is under 100 MB.
#   manifests  deploy/kubernetes renders, validates strictly (Kubernetes 1.27 and 1.37, custom
#              resources against deploy/tests/crd-schemas.yaml), holds the probe, security and
#              replica rules; the PrometheusRule matches deploy/prometheus/alerts.yml.
#   dashboard  deploy/grafana/topology-claims.json is what its builder makes, round-trips
#              through grafana-foundation-sdk, links to runbooks that exist, and queries only
#              series that a live serve, reconcile and verify export.
#
# Usage: deploy/test.sh [image|manifests|dashboard]...   (default: all three; under CI=true
# always all three, and a missing tool fails instead of skipping its part).
# Environment:
#   TOPOLOGY_CLAIMS_BINARY  prebuilt release binary for the image (default: build.sh runs
#                           cargo build --release -p topology-claims-cli --bin topology-claims)
#   TOPOLOGY_CLAIMS_BIN     binary for the live metrics of the dashboard test
#                           (default target/debug/topology-claims)
#   TOPOLOGY_CLAIMS_IMAGE   image name (default localhost/topology-claims)
#   CONTAINERS_CONF         podman configuration (default deploy/container/containers.conf)
#   TOPOLOGY_CLAIMS_KUBERNETES_VERSIONS  versions to validate against (default "1.27.0 1.37.0":
#                           the oldest supported, gRPC probes GA, and the newest schema shipped)
#   TOPOLOGY_CLAIMS_DEPLOY_WAIT_SECONDS  how long the dashboard test waits for a live process's
#                           address or series (default 30)
set -euo pipefail
cd "$(dirname "$0")/.."

all=(image manifests dashboard)
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=("${all[@]}")
if [ "${CI:-}" = "true" ] && [ "${parts[*]}" != "${all[*]}" ]; then
  echo "deploy/test.sh: under CI=true every part runs; got: ${parts[*]}" >&2
  exit 1
fi

export CONTAINERS_CONF="${CONTAINERS_CONF:-$(pwd)/deploy/container/containers.conf}"
image="${TOPOLOGY_CLAIMS_IMAGE:-localhost/topology-claims}"
max_image_mb=100
failed=0

# A missing tool: fails under CI=true, otherwise skips the part that needs it, loudly.
missing() {
  echo "deploy/test.sh: $1 NOT tested: $2 (scripts/ensure-services.sh installs it)" >&2
  if [ "${CI:-}" = "true" ]; then exit 1; fi
}

have_python_modules() {
  python3 - "$@" <<'EOF' 2>/dev/null
import importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
EOF
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Waits until the container's log has printed `listening on` at least $2 times.
wait_listening() {
  local container="$1" times="$2"
  for _ in $(seq 1 300); do
    if [ "$(podman logs "${container}" 2>/dev/null | grep -c '^listening on ')" -ge "${times}" ]; then
      return 0
    fi
    if [ "$(podman inspect -f '{{.State.Running}}' "${container}")" != "true" ]; then
      break
    fi
    sleep 0.1
  done
  echo "the container ${container} did not print 'listening on' (run ${times}); its log:" >&2
  podman logs "${container}" 2>&1 | tail -n 20 >&2
  return 1
}

# SIGTERM, then the exit status must be 0 after draining.
stop_with_sigterm() {
  local container="$1" status
  podman kill --signal TERM "${container}" >/dev/null
  status="$(timeout 60 podman wait "${container}")" \
    || { echo "the container ${container} did not exit within 60s of SIGTERM" >&2; return 1; }
  if [ "${status}" != "0" ]; then
    echo "the container ${container} exited ${status} on SIGTERM, not 0; its log:" >&2
    podman logs "${container}" 2>&1 | tail -n 20 >&2
    return 1
  fi
  # Into a variable first: `grep -q` on a pipe may close it early, and pipefail would count
  # the writer's SIGPIPE as a failure.
  local log
  log="$(podman logs "${container}" 2>&1)"
  grep -q 'drained; exiting' <<<"${log}" \
    || { echo "the container ${container} exited 0 without logging 'drained; exiting'" >&2; return 1; }
}

test_image() {
  if [ "$(id -u)" != 0 ]; then missing image "needs root (rootful podman)"; return 0; fi
  local tool
  for tool in podman runc debootstrap curl; do
    command -v "${tool}" >/dev/null || { missing image "${tool} not found"; return 0; }
  done
  have_python_modules grpc grpc_tools grpc_health.v1 \
    || { missing image "python modules grpcio, grpcio-tools, grpcio-health-checking"; return 0; }

  local start run_id work container volume grpc_port health_port metrics_port ref size_mb out
  start=$(date +%s)
  local build_log
  build_log="$(mktemp /tmp/topology-claims-image-build.XXXXXX.log)"
  if ! TOPOLOGY_CLAIMS_IMAGE="${image}" deploy/container/build.sh >/dev/null 2>"${build_log}"; then
    tail -n 30 "${build_log}" >&2
    echo "image: deploy/container/build.sh failed (whole log: ${build_log})" >&2
    return 1
  fi
  rm -f "${build_log}"
  echo "image: built in $(( $(date +%s) - start ))s"
  ref="${image}:dev"

  size_mb=$(( $(podman image inspect --format '{{.Size}}' "${ref}") / 1000000 ))
  [ "${size_mb}" -lt "${max_image_mb}" ] \
    || { echo "image ${ref} is ${size_mb} MB, over the ${max_image_mb} MB limit" >&2; return 1; }
  echo "image: ${ref} is ${size_mb} MB (limit ${max_image_mb} MB)"
  out="$(podman image inspect --format '{{.Config.User}} {{json .Config.Entrypoint}} {{json .Config.Volumes}}' "${ref}")"
  case "${out}" in
    "10001:10001 [\"/usr/local/bin/topology-claims\"] "*'"/var/lib/topology-claims"'*) ;;
    *) echo "image ${ref}: user, entrypoint or volume is not as expected: ${out}" >&2; return 1 ;;
  esac

  run_id="tc-deploy-test-$$"
  container="${run_id}"
  volume="${run_id}-data"
  work="$(mktemp -d /tmp/topology-claims-deploy-test.XXXXXX)"
  # Each part runs in a subshell of its own (below): this cleans up however it ends.
  # shellcheck disable=SC2064
  trap "podman rm -f '${container}' >/dev/null 2>&1; podman volume rm -f '${volume}' >/dev/null 2>&1; rm -rf '${work}'" EXIT

  # Without TLS the default CMD must refuse to serve on 0.0.0.0.
  if out="$(podman run --rm "${ref}" 2>&1)"; then
    echo "image ${ref}: the default CMD served plaintext on 0.0.0.0 (exit 0)" >&2; return 1
  fi
  grep -q 'refusing to serve plaintext' <<<"${out}" \
    || { echo "image ${ref}: the default CMD without TLS failed differently: ${out}" >&2; return 1; }
  echo "image: the default CMD refuses plaintext off loopback"

  # A development PKI, made by the image's own binary (as the container's user).
  mkdir -p "${work}/certs" && chown 10001:10001 "${work}/certs"
  certs() { podman run --rm -v "${work}/certs:/certs" "${ref}" certs "$@" --dir /certs >/dev/null; }
  certs ca
  certs server --dns localhost --ip 127.0.0.1
  certs client --role cell --name cell-1

  grpc_port="$(free_port)"
  health_port="$(free_port)"
  metrics_port="$(free_port)"
  podman run -d --name "${container}" \
    -p "127.0.0.1:${grpc_port}:50051" -p "127.0.0.1:${health_port}:50052" \
    -p "127.0.0.1:${metrics_port}:9464" \
    -v "${volume}:/var/lib/topology-claims" -v "${work}/certs:/etc/topology-claims/tls:ro" \
    -e TOPOLOGY_CLAIMS_TLS_CERT=/etc/topology-claims/tls/server.pem \
    -e TOPOLOGY_CLAIMS_TLS_KEY=/etc/topology-claims/tls/server-key.pem \
    -e TOPOLOGY_CLAIMS_TLS_CLIENT_CA=/etc/topology-claims/tls/ca.pem \
    "${ref}" >/dev/null
  wait_listening "${container}" 1
  echo "image: the default CMD with mTLS printed 'listening on'"

  local tls=(--ca "${work}/certs/ca.pem")
  local cell=(--cert "${work}/certs/cell-cell-1.pem" --key "${work}/certs/cell-cell-1-key.pem")
  local service status
  for service in "" topology.claims.v1.ClaimsService; do
    status=""
    for _ in $(seq 1 50); do
      status="$(python3 deploy/tests/grpc_probe.py --target "localhost:${grpc_port}" "${tls[@]}" \
                health --service "${service}" 2>&1)" && break
      sleep 0.2
    done
    [ "${status}" = "SERVING" ] \
      || { echo "image: gRPC health \"${service}\" from the host: ${status}" >&2; return 1; }
  done
  echo "image: gRPC health \"\" and topology.claims.v1.ClaimsService SERVING from the host (mTLS)"
  # What the kubelet's gRPC probes see: plaintext, on --health-listen (the default CMD's 50052).
  for service in "" topology.claims.v1.ClaimsService; do
    status="$(python3 deploy/tests/grpc_probe.py --target "localhost:${health_port}" \
              health --service "${service}" 2>&1)"
    [ "${status}" = "SERVING" ] \
      || { echo "image: plaintext health \"${service}\" on the health port: ${status}" >&2; return 1; }
  done
  echo "image: plaintext gRPC health SERVING on the health port (what Kubernetes probes use)"
  out="$(curl -sf "http://127.0.0.1:${metrics_port}/metrics")" \
    || { echo "image: the metrics port answered no /metrics" >&2; return 1; }
  grep -q '^topology_claims_build_info{' <<<"${out}" \
    || { echo "image: no topology_claims_build_info at the metrics port" >&2; return 1; }

  local pid uids
  pid="$(podman inspect -f '{{.State.Pid}}' "${container}")"
  uids="$(awk '/^Uid:/ {print $2, $3, $4, $5}' "/proc/${pid}/status")"
  [ "${uids}" = "10001 10001 10001 10001" ] \
    || { echo "image: the server runs with uids ${uids}, not the non-root 10001" >&2; return 1; }
  echo "image: the server runs as uid 10001 (non-root)"

  python3 deploy/tests/grpc_probe.py --target "localhost:${grpc_port}" "${tls[@]}" "${cell[@]}" \
    begin-commit --cell-id cell-1 --email deploy-test@example.com >/dev/null
  stop_with_sigterm "${container}"
  echo "image: SIGTERM drained and exited 0"

  podman start "${container}" >/dev/null
  wait_listening "${container}" 2
  out="$(podman run --rm --network host -v "${work}/certs:/certs:ro" "${ref}" lookup \
           --server "https://localhost:${grpc_port}" --tls-ca /certs/ca.pem \
           --tls-cert /certs/cell-cell-1.pem --tls-key /certs/cell-cell-1-key.pem \
           --namespace emails --value deploy-test@example.com 2>&1)" \
    || { echo "image: lookup after the restart failed: ${out}" >&2; return 1; }
  grep -q '^cell: *cell-1$' <<<"${out}" && grep -q '^state: *active$' <<<"${out}" \
    || { echo "image: after the restart the claim is not cell-1's and active: ${out}" >&2; return 1; }
  echo "image: BeginUpdate + CommitUpdate survived a container restart on the SQLite volume"
  stop_with_sigterm "${container}"
  echo "image: passed in $(( $(date +%s) - start ))s"
}

test_manifests() {
  command -v kubectl >/dev/null || { missing manifests "kubectl not found"; return 0; }
  command -v kubernetes-validate >/dev/null || { missing manifests "kubernetes-validate not found"; return 0; }
  have_python_modules yaml jsonschema || { missing manifests "python modules pyyaml, jsonschema"; return 0; }
  local start
  start=$(date +%s)
  python3 deploy/kubernetes/generate-prometheusrule.py --check
  python3 deploy/tests/check_manifests.py
  echo "manifests: passed in $(( $(date +%s) - start ))s"
}

test_dashboard() {
  have_python_modules grafana_foundation_sdk grpc grpc_tools \
    || { missing dashboard "python modules grafana-foundation-sdk, grpcio, grpcio-tools"; return 0; }
  local start
  start=$(date +%s)
  python3 deploy/tests/check_dashboard.py --binary "${TOPOLOGY_CLAIMS_BIN:-target/debug/topology-claims}"
  echo "dashboard: passed in $(( $(date +%s) - start ))s"
}

for part in "${parts[@]}"; do
  case "${part}" in
    image|manifests|dashboard)
      echo "== deploy/test.sh: ${part}"
      # A subshell with errexit of its own: a function called as `f || …` would run with
      # errexit off, and a failing step would pass unnoticed.
      set +e
      (set -e; "test_${part}")
      status=$?
      set -e
      if [ "${status}" != 0 ]; then echo "deploy/test.sh: ${part} FAILED" >&2; failed=1; fi ;;
    *) echo "deploy/test.sh: unknown part ${part} (image, manifests, dashboard)" >&2; exit 1 ;;
  esac
done
exit "${failed}"
