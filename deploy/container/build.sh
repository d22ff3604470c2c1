#!/usr/bin/env bash
# Builds the topology-claims image from a release build with deploy/container/Containerfile,
# tagged IMAGE:dev and IMAGE:VERSION (the binary's version). Works without a registry: when the
# base image cannot be pulled, a Debian bookworm base is made with debootstrap from the apt
# mirror and imported (once; later builds reuse it). docs/deployment.md, "The image".
#
# Every option is a flag or an environment variable:
#   --binary PATH        TOPOLOGY_CLAIMS_BINARY         a prebuilt release binary; default: run
#                                                       `cargo build --release -p topology-claims-cli
#                                                       --bin topology-claims` and use
#                                                       ${CARGO_TARGET_DIR:-target}/release/topology-claims
#   --image NAME         TOPOLOGY_CLAIMS_IMAGE          default localhost/topology-claims
#   --base IMAGE|auto    TOPOLOGY_CLAIMS_BASE_IMAGE     default auto: the registry base
#                                                       (docker.io/library/debian:bookworm-slim) if it
#                                                       can be pulled, else the local base below
#   --local-base NAME    TOPOLOGY_CLAIMS_LOCAL_BASE     default localhost/topology-claims-build-base:bookworm
#   --debian-mirror URL  TOPOLOGY_CLAIMS_DEBIAN_MIRROR  default: the first Debian URI of the host's
#                                                       apt sources, else http://deb.debian.org/debian
#   --engine podman|docker  TOPOLOGY_CLAIMS_CONTAINER_ENGINE  default podman
# podman reads deploy/container/containers.conf (runc, nofile and nproc 16384) unless CONTAINERS_CONF is set.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "${here}/../.." && pwd)"
registry_base="docker.io/library/debian:bookworm-slim"

binary="${TOPOLOGY_CLAIMS_BINARY:-}"
image="${TOPOLOGY_CLAIMS_IMAGE:-localhost/topology-claims}"
base="${TOPOLOGY_CLAIMS_BASE_IMAGE:-auto}"
local_base="${TOPOLOGY_CLAIMS_LOCAL_BASE:-localhost/topology-claims-build-base:bookworm}"
mirror="${TOPOLOGY_CLAIMS_DEBIAN_MIRROR:-}"
engine="${TOPOLOGY_CLAIMS_CONTAINER_ENGINE:-podman}"

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "build.sh: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
  case "$1" in
    --binary) binary="${2:?--binary needs a path}"; shift 2 ;;
    --image) image="${2:?--image needs a name}"; shift 2 ;;
    --base) base="${2:?--base needs an image or auto}"; shift 2 ;;
    --local-base) local_base="${2:?--local-base needs a name}"; shift 2 ;;
    --debian-mirror) mirror="${2:?--debian-mirror needs a URL}"; shift 2 ;;
    --engine) engine="${2:?--engine needs podman or docker}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done

case "${engine}" in
  podman) export CONTAINERS_CONF="${CONTAINERS_CONF:-${here}/containers.conf}" ;;
  docker) ;;
  *) die "--engine must be podman or docker, not ${engine}" ;;
esac
command -v "${engine}" >/dev/null || die "${engine} not found (scripts/ensure-services.sh installs podman)"

# The release binary.
if [ -z "${binary}" ]; then
  echo "build.sh: cargo build --release -p topology-claims-cli --bin topology-claims" >&2
  (cd "${repo}" && cargo build --release -p topology-claims-cli --bin topology-claims)
  target_dir="${CARGO_TARGET_DIR:-${repo}/target}"
  binary="${target_dir}/release/topology-claims"
fi
[ -x "${binary}" ] || die "the binary ${binary} does not exist or is not executable (--binary / TOPOLOGY_CLAIMS_BINARY)"
version="$("${binary}" --version | awk '{print $2}')" || die "cannot run ${binary} --version"
[ -n "${version}" ] || die "${binary} --version printed no version"

image_exists() { "${engine}" image inspect "$1" >/dev/null 2>&1; }

debian_mirror() {
  if [ -n "${mirror}" ]; then echo "${mirror}"; return; fi
  local found
  found="$( (grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}';
             grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list | awk '{print $2}') \
           | grep -m1 '/debian/\?$' || true)"
  echo "${found:-http://deb.debian.org/debian}"
}

# The local base: Debian bookworm minbase + CA certificates + binutils (strip), imported once.
make_local_base() {
  if image_exists "${local_base}"; then
    echo "build.sh: local base ${local_base} already present" >&2
    return
  fi
  command -v debootstrap >/dev/null || die "debootstrap not found and ${local_base} missing (scripts/ensure-services.sh installs it)"
  [ "$(id -u)" = 0 ] || die "debootstrap needs root to make ${local_base}"
  local dir url
  dir="$(mktemp -d /tmp/topology-claims-base.XXXXXX)"
  url="$(debian_mirror)"
  echo "build.sh: debootstrap --variant=minbase bookworm from ${url} (about a minute)" >&2
  if ! debootstrap --variant=minbase --include=ca-certificates,binutils bookworm "${dir}" "${url}" \
       >"${dir}.log" 2>&1; then
    tail -n 20 "${dir}.log" >&2
    rm -rf "${dir}"
    die "debootstrap from ${url} failed (log above; --debian-mirror / TOPOLOGY_CLAIMS_DEBIAN_MIRROR)"
  fi
  rm -rf "${dir}/var/cache/apt/archives/"*.deb "${dir}/var/lib/apt/lists/"*
  tar -C "${dir}" -c . | "${engine}" import - "${local_base}" >/dev/null \
    || die "importing ${dir} as ${local_base} failed"
  rm -rf "${dir}" "${dir}.log"
  echo "build.sh: imported ${local_base}" >&2
}

if [ "${base}" = "auto" ]; then
  if image_exists "${registry_base}" || "${engine}" pull -q "${registry_base}" >/dev/null 2>&1; then
    base="${registry_base}"
  else
    echo "build.sh: ${registry_base} cannot be pulled; using the local base ${local_base}" >&2
    make_local_base
    base="${local_base}"
  fi
elif [ "${base}" = "${local_base}" ]; then
  make_local_base
fi

# The image this build replaces, removed afterwards if nothing else names it (no pile of
# untagged images after many builds).
previous="$("${engine}" image inspect --format '{{.Id}}' "${image}:dev" 2>/dev/null || true)"

context="$(mktemp -d /tmp/topology-claims-image.XXXXXX)"
trap 'rm -rf "${context}"' EXIT
cp "${binary}" "${context}/topology-claims"
echo "build.sh: building ${image}:dev and ${image}:${version} from ${binary} on ${base}" >&2
pull_never=()
# --layers=false: no intermediate images are kept (the root stage is a few seconds to redo).
[ "${engine}" = podman ] && pull_never=(--pull=never --layers=false)
"${engine}" build "${pull_never[@]}" -f "${here}/Containerfile" --build-arg "BASE_IMAGE=${base}" \
  -t "${image}:dev" -t "${image}:${version}" "${context}" >&2 \
  || die "${engine} build failed (Containerfile ${here}/Containerfile, base ${base})"
current="$("${engine}" image inspect --format '{{.Id}}' "${image}:dev")"
if [ -n "${previous}" ] && [ "${previous}" != "${current}" ]; then
  "${engine}" rmi "${previous}" >/dev/null 2>&1 || true   # refused while another tag names it
fi
size="$("${engine}" image inspect --format '{{.Size}}' "${image}:dev")"
echo "build.sh: ${image}:dev ${image}:${version} ($((size / 1000000)) MB)" >&2
echo "${image}:dev"
