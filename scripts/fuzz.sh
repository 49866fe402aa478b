#!/usr/bin/env bash
# Builds the libFuzzer targets with clang++ in build-fuzz (Note [Fuzz targets] in CMakeLists.txt)
# and runs each for SECONDS (default 30) over its corpus. A crash leaves build-fuzz/crash-<parser>-*:
# copy it into tests/data/fuzz/<parser>/ so the normal suite replays it (FuzzRegression).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-30}
prefix=""
if [ -x .venv/bin/python ]; then prefix=$(.venv/bin/python -c 'import torch; print(torch.utils.cmake_prefix_path)'); fi
CXX=clang++ CC=clang cmake -G Ninja -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTANDEM_FUZZ=ON \
  -DTANDEM_FUZZ_SECONDS="$SECONDS_EACH" -DTANDEM_CUDA=OFF ${prefix:+-DCMAKE_PREFIX_PATH="$prefix"} >/dev/null
ninja -C build-fuzz
ctest --test-dir build-fuzz --output-on-failure -R '^fuzz\.' -j"$(nproc)"
