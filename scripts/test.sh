#!/usr/bin/env bash
# Installs what is missing, builds with warnings as errors, and runs every test through ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh -DTOPOCCL_WERROR=ON -DTOPOCCL_BUILD_TESTS=ON
cd "${BUILD_DIR:-build}"
# Two at a time: the machine has two cores and many tests start several ranks.
ctest --output-on-failure -j "${CTEST_JOBS:-2}" --timeout 900 "$@"
cd - >/dev/null
# A short libFuzzer run of the topology loaders (skipped, and says so, where clang++/libFuzzer is absent).
# A fixed seed keeps CI reproducible; `scripts/fuzz.sh 600` alone explores with fresh seeds.
TOPOCCL_FUZZ_SEED="${TOPOCCL_FUZZ_SEED:-20261123}" TOPOCCL_FUZZ_BUILD_DIR="${BUILD_DIR:-build}/fuzz" scripts/fuzz.sh "${TOPOCCL_FUZZ_SECONDS:-30}"
