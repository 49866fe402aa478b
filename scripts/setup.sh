#!/usr/bin/env bash
# Sets up tandem on a fresh Debian 12 machine and builds it (Release, Ninja, precompiled headers).
# Idempotent: installs only what is missing, reconfigures only when needed, rebuilds incrementally.
#
#   scripts/setup.sh           what the program needs, and the program (build/tandem): the README's
#                              first command, so the default job starts without building the tests
#   scripts/setup.sh --tests   also the tests' tools (promtool, headless Chromium, clang for the
#                              fuzzers, the Python packages they compare against) and every target:
#                              what scripts/test.sh runs
#
# LibTorch: an existing one is used when Torch_DIR or CMAKE_PREFIX_PATH points at it; otherwise a
# venv at .venv gets torch==2.11.0 from PyPI and its bundled LibTorch is used.
# CUDA code is built when nvcc is found (PATH or /usr/local/cuda), a CPU-only build otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."

TESTS=0
for arg in "$@"; do
  case $arg in
    --tests) TESTS=1 ;;
    *) echo "setup.sh: unknown option '$arg'; use --tests (the test suite's tools and targets) or nothing" >&2; exit 2 ;;
  esac
done

TORCH_VERSION=2.11.0
TRANSFORMERS_VERSION=5.24.0  # the tests' reference (tests/io/hf_transformers_fixture.py)
BUILD_DIR=${TANDEM_BUILD_DIR:-build}
APT_PACKAGES=(build-essential cmake ninja-build git python3 python3-venv python3-pip python3-dev
              libyaml-cpp-dev nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev
              libgtest-dev libgmock-dev libbenchmark-dev
              libcpp-httplib-dev libjs-chart.js libssl-dev libgloo-dev libhwloc-dev libicu-dev libsentencepiece-dev
              liburing-dev)
TEST_APT_PACKAGES=(prometheus chromium fonts-liberation clang)  # the tests' promtool, headless browser, libFuzzer
((TESTS)) && APT_PACKAGES+=("${TEST_APT_PACKAGES[@]}")

say() { printf '[setup] %s\n' "$*"; }

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  say "installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# LibTorch.
prefix=""
if [ -n "${Torch_DIR:-}" ]; then
  say "using LibTorch from Torch_DIR=$Torch_DIR"
elif [ -n "${CMAKE_PREFIX_PATH:-}" ] && ls "${CMAKE_PREFIX_PATH%%:*}"/Torch/TorchConfig.cmake >/dev/null 2>&1; then
  prefix=$CMAKE_PREFIX_PATH
  say "using LibTorch from CMAKE_PREFIX_PATH=$prefix"
else
  if [ ! -x .venv/bin/python ]; then
    say "creating .venv"
    python3 -m venv .venv
  fi
  if ! .venv/bin/python -c "import torch, sys; sys.exit(0 if torch.__version__.split('+')[0] == '$TORCH_VERSION' else 1)" 2>/dev/null; then
    say "installing torch==$TORCH_VERSION into .venv (the LibTorch distribution; a few GB)"
    .venv/bin/pip install -q --disable-pip-version-check "torch==$TORCH_VERSION"
  fi
  # Test-only: tests/io/hf_transformers_test.cpp compares tandem with transformers itself;
  # tests/python/test_tokenizers_parity.py compares its tokenizers with `tokenizers` and `sentencepiece`;
  # tests/python/test_tokenizer_converters.py makes Llama 3's tokenizer.json with transformers'
  # TikTokenConverter, which needs `tiktoken`;
  # tests/python/test_serve.py drives `tandem serve` with the official `openai` client;
  # tests/python/test_trainer.py runs transformers' Trainer (which needs accelerate).
  # The test command also builds the package's wheel here without build isolation (scikit-build-core).
  if ((TESTS)) && ! .venv/bin/python -c "import transformers, accelerate, safetensors, pytest, tokenizers, sentencepiece, tiktoken, openai, scikit_build_core, sys; sys.exit(0 if transformers.__version__ == '$TRANSFORMERS_VERSION' else 1)" 2>/dev/null; then
    say "installing the tests' Python packages into .venv (transformers==$TRANSFORMERS_VERSION, accelerate, safetensors, pytest, tokenizers, sentencepiece, tiktoken, openai, scikit-build-core)"
    .venv/bin/pip install -q --disable-pip-version-check "transformers==$TRANSFORMERS_VERSION" accelerate safetensors pytest \
      tokenizers sentencepiece tiktoken openai scikit-build-core
  fi
  prefix=$(.venv/bin/python -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null)
fi

# nvcc: on PATH, or the toolkit's usual place.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi

cmake_args=(-G Ninja -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release)
[ -n "$prefix" ] && cmake_args+=("-DCMAKE_PREFIX_PATH=$prefix")
[ -n "${Torch_DIR:-}" ] && cmake_args+=("-DTorch_DIR=$Torch_DIR")
stamp="$BUILD_DIR/.tandem-setup"
want="${cmake_args[*]} ${TANDEM_CMAKE_ARGS:-}"
if [ ! -f "$BUILD_DIR/build.ninja" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  say "configuring $BUILD_DIR"
  # shellcheck disable=SC2086
  cmake "${cmake_args[@]}" ${TANDEM_CMAKE_ARGS:-} >"$BUILD_DIR.cmake.log" 2>&1 || { cat "$BUILD_DIR.cmake.log"; exit 1; }
  grep -E "^-- tandem:" "$BUILD_DIR.cmake.log" || true
  echo "$want" >"$stamp"
fi
if ((TESTS)); then
  say "building"
  cmake --build "$BUILD_DIR" -j"$(nproc)"
else
  say "building the program (scripts/setup.sh --tests, which scripts/test.sh runs, builds the tests too)"
  cmake --build "$BUILD_DIR" -j"$(nproc)" --target tandem
fi
# The Python package (Note [Python package]) is installed the pip way (`pip install .`; the test
# command does it from this build folder). A path file of earlier setups would shadow it: gone.
if [ -x .venv/bin/python ]; then
  site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  rm -f "$site/tandem.pth"
fi
say "ready: $BUILD_DIR/tandem"
