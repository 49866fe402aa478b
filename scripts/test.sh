#!/usr/bin/env bash
# Builds (through setup.sh --tests: the tests' tools and every target; fast when nothing changed)
# and runs the test suite with CTest.
# GPU tests skip where no CUDA device is visible.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --tests
echo "test.sh: setup and build took ${SECONDS} s"
# The Python package the pip way (Note [Python package]): its wheel built from setup.sh's build
# folder (nothing is compiled twice), installed into .venv, where the Python tests import it.
build=${TANDEM_BUILD_DIR:-build}
rm -f "$build"/wheel/tandem-*.whl
.venv/bin/pip wheel -q --disable-pip-version-check --no-build-isolation --no-deps --config-settings=build-dir="$build" \
  --config-settings=cmake.define.TANDEM_TESTS=ON -w "$build/wheel" .
.venv/bin/pip install -q --disable-pip-version-check --force-reinstall --no-deps "$build"/wheel/tandem-*.whl
# Tests run in parallel, one per core: one intra-op thread each avoids oversubscribing the cores.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# The parsers under libFuzzer for a bounded time (FUZZ_SECONDS each; 0 skips), in their own clang build.
if [ "${FUZZ_SECONDS:-20}" != 0 ] && command -v clang++ >/dev/null; then
  scripts/fuzz.sh "${FUZZ_SECONDS:-20}"
fi
echo "test.sh: the wheel and the fuzz runs done at ${SECONDS} s"
ctest --test-dir "${TANDEM_BUILD_DIR:-build}" --output-on-failure -j"$(nproc)" --timeout 900 "$@"
