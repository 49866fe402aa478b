#!/usr/bin/env bash
# Builds (through setup.sh, fast when nothing changed) and runs the test suite with CTest.
# GPU tests skip where no CUDA device is visible.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# Tests run in parallel, one per core: one intra-op thread each avoids oversubscribing the cores.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# The parsers under libFuzzer for a bounded time (FUZZ_SECONDS each; 0 skips), in their own clang build.
if [ "${FUZZ_SECONDS:-20}" != 0 ] && command -v clang++ >/dev/null; then
  scripts/fuzz.sh "${FUZZ_SECONDS:-20}"
fi
ctest --test-dir "${TANDEM_BUILD_DIR:-build}" --output-on-failure -j"$(nproc)" --timeout 900 "$@"
