#!/usr/bin/env bash
# Builds (through setup.sh, fast when nothing changed) and runs the test suite with CTest.
# GPU tests skip where no CUDA device is visible.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# Tests run in parallel, one per core: one intra-op thread each avoids oversubscribing the cores.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
ctest --test-dir "${TANDEM_BUILD_DIR:-build}" --output-on-failure -j"$(nproc)" --timeout 900 "$@"
