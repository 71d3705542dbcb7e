#!/usr/bin/env bash
# Installs the Debian packages topoccl builds and tests with. Idempotent and quiet when all are present.
set -euo pipefail
packages=(
  build-essential cmake pkg-config git
  catch2 libpugixml-dev nlohmann-json3-dev libcli11-dev
  libhwloc-dev hwloc libibverbs-dev rdma-core ibverbs-utils
  libopenmpi-dev openmpi-bin
  coinor-libcbc-dev coinor-cbc graphviz
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
