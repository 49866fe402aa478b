#!/usr/bin/env bash
# On the GPU machine: build against its PyTorch's LibTorch, run the test suite (GPU tests
# included), then the benchmarks, each against its peer in the same run:
#   optim  the CPU optimizer kernels (`tandem bench optim`) against torch's CPU AdamW and DeepSpeed
#          CPUAdam (bench/optim_peers.py; DeepSpeed from the wheels in .whl when present),
#          256M and 1B parameters (OPTIM_PARAMS), alternating OPTIM_ROUNDS times (default 2);
#   train  tandem and PyTorch eager on the identical 1B model (bf16, B=8, T=2048), alternating;
#   hardening runs that cannot fit (7B without offload on one GPU, 13B offloaded into a 16 GiB host, a huge
#          micro-batch) are refused up front with exit 2;
#   bk     the BK-core kernels against LibTorch ops, cuSPARSE gtsv2 and the bandwidth floor
#          (`tandem bench bk_core`), then ResNet-BK 125M and LLaMA 125M training runs side by side;
#   offload the offload engine: 125M offload against GPU-only AdamW with the same seed on a text
#          corpus (loss agreement; deterministic kernels, then the non-deterministic noise floor),
#          1B GPU-only against offload at k = 0 and k = auto (speed, traces);
#   telemetry the sampler's cost (1B with monitor.enabled on and off, alternating) and joules per token;
#          then a 1B offload run with the dashboard, /metrics and TensorBoard on: the page's data and
#          /metrics captured while it trains, the trace with counter tracks, report.html, and the
#          event file read back by TensorBoard's own reader;
#   resilience a real out-of-memory at 7B (offload, micro-batch RES_BATCH, default 32) recovering by
#          halving; 1B GPU-resident with a checkpoint at step 20, written in the background and in
#          place, for the step-time cost;
#   big    OFFLOAD_BIG (default 7B; BIG_BATCH, default 8; BIG_LR, default 3e-4; BIG_SET extra settings) with checkpointing: the forward+backward bound (`tandem bench
#          step`), the engine exact and delayed, DeepSpeed ZeRO-2 offload (bench/deepspeed_offload.py); BIG_PARTS
#          (default "bound exact delayed deepspeed") may add exactfp32: exact with the GPU-updated Blocks' states in
#          fp32 (optim.device_state_dtype=fp32), the A/B for Note [Device Adam]; spec: every step speculative
#          (offload.speculate=always; clipped steps taken back, Note [Retraction]); specnoclip: the same with
#          train.grad_clip=0;
#   dist   weak scaling over 1, 2 and 4 GPUs (those the machine has; DIST_NS overrides), the micro-batch per GPU
#          fixed, tandem and its peer alternating at each GPU count: 1B GPU-resident (the train part's settings,
#          DIST_STEPS, default 30) against PyTorch DDP; DIST_BIG (default 13B; DIST_BIG_BATCH, default BIG_BATCH
#          or 8; DIST_BIG_STEPS, default 8) offloaded with sharded optimizer state (offload.optimizer=cpu,
#          dist.zero_stage=2) against DeepSpeed ZeRO-2 with offload_optimizer=cpu. DIST_PARTS (default "resident
#          offload") and DIST_SIDES (default "tandem peer") select; DIST_TIMEOUT / DIST_BIG_TIMEOUT (default
#          240 / 540 s) limit each run. DIST_PARTS may add: pipeline (1B in 2 stages, 1F1B, tandem against
#          torch.distributed.pipelining, bench/pipelining_peer.py; PP_STAGES stages, PP_CUTS cuts, PP_SET settings; each
#          side's step 4 pass by pass from bench/pipeline_gaps.py), pp-offload (DIST_BIG in 2 stages with the offload
#          engine), largest (the most of LARGEST_LAYERS, default "56 54 52", layers of LLaMA-30B's width that the
#          plan admits, in 2 stages with offload, LARGEST_STEPS, default 50, steps on real text). Each run
#          prints its GPUs' peak memory in use as nvidia-smi sees it.
#   placement energy-aware Block placement (Note [Block placement]) on PL_MODELS (default "amx-moe 1B"): all-GPU
#          (static), the threshold rule (200 W, 80 %), the cost model under a GPU power budget of 60 % of the
#          all-GPU run's average power, and all-GPU idled to the same budget (cost model, nothing movable);
#          PL_STEPS_<model> steps each (default 60 for amx-moe, 30 for 1B); table via bench/placement_table.py.
#   serve  generation: tandem generate (resident with and without CUDA graphs, and streaming all but 4 layers) against transformers'
#          generate on one random-weight 1B folder; closed-loop load on `tandem serve` over the same
#          folder (bench/serve_load.py, SERVE_CLIENTS clients, default 64, for SERVE_LOAD_S s, default
#          60), and the mixed load of a chat service (--mix; SERVE_MIX=0 leaves it out); the server's tests
#          with the openai client on the GPU. SERVE_AB=1 repeats generation and the load
#          with LibTorch's ops only (TANDEM_DECODE_KERNELS=torch); SERVE_DEP_AB=1 (default) repeats the batch-1
#          runs with the decode kernels launched the ordinary way (TANDEM_DEPENDENT_LAUNCH=off, Note [Dependent
#          launch]); SERVE_EPI_AB=1 (default) repeats them with the products' epilogues apart
#          (TANDEM_DECODE_KERNELS=separate, Note [Skinny epilogues]), with the layered kernels (fused) and with
#          the whole step in one launch (persistent, Note [Persistent decode step]), SERVE_AB_BATCHES prompts; SERVE_NCU=1 times one decode step's kernels
#          (bench/ncu_kernels.py --last-step). SERVE_BIG=1 adds a model larger than
#          its GPU share: the 13B preset's shape with random weights, streamed by tandem generate at 16 and 6 GiB,
#          against transformers + accelerate CPU offload at 16 GiB, with the PCIe bound; SERVE_BIG=only runs that alone.
#   families the decoder families' tests on cuda (tests/python/test_families.py), then tandem generate against
#          transformers' generate on random-weight bf16 folders of FAM_PRESETS (Qwen2.5-0.5B, Gemma2-2B, Mistral-7B).
#   pipeline the partitioner's profile and plan (1B, the CPU weighed as a stage), and a 125M run in two
#          stages over the CPU and the GPU with the predicted step against the measured one;
#   trainer transformers' Trainer on a Mistral-7B shape with tandem's OffloadAdamW, torchao's CPUOffloadOptimizer
#          and DeepSpeed ZeRO-2 offload (bench/trainer_peers.py; TR_SHAPE, TR_BATCH, TR_SEQ, TR_SIDES, TR_LAYERS);
#   actoff activation offload against recomputation (Note [Activation offload]): `tandem bench step` of OFFLOAD_BIG
#          at BIG_BATCH with checkpointing and the saved tensors of N of its layers in pinned host memory for each N
#          in ACT_LAYERS (default "0 8 16 24 32"; 0 is the checkpointed bound; auto: Note [Automatic activation offload]), and without checkpointing (every
#          activation kept on the GPU, the floor; ACT_KEEP=0 leaves it out) where it fits; then the engine exact
#          (ACT_ENGINE, default "0 16": N per run) with BIG_SET.
#   curve  1B on real text for CURVE_STEPS (default 320): GPU-only, offload k = 0 exact and delayed (bf16
#          states, host ring), one plot (bench/train_curves.py); CURVE_RUNS may add spec (speculating), int8, delayedN, bf16sr,
#          bf16kahan and int8sr (bf16 masters), int8st and int8srst (8-bit codes rounded stochastically);
#   capacity the largest of CAP_LAYERS layers of LLaMA-30B's width one GPU trains with a bf16 master and 8-bit
#          states (each size's plan kept), CAP_STEPS steps on real text, the GPU's peak memory in use;
#   nvme   the NVMe tier (Note [NVMe tier]): `tandem bench nvme` on NVME_DIR's disk (the bound), then 7B (B=8,
#          T=2048, bf16, NVME_STATES states, default int8) for NVME_STEPS steps without the tier and with the states
#          of NVME_BLOCKS (default 16) of its CPU-updated blocks on it, updates after the norm in both; NVME_SET
#          adds settings to both runs.
# OFF_1B=0 leaves out the 1B offload runs. PARTS selects (default "tests optim train bk offload"; add big, dist); CTEST_ARGS (e.g. "-R BkCore") narrows the tests. Prints short tables last. Logs and JSON go to $OUT
# (or ./gpu-check-out).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-gpu}
STEPS=${STEPS:-30}
PARTS=${PARTS:-tests optim train bk offload}
OFF_STEPS=${OFF_STEPS:-300}
BK_STEPS=${BK_STEPS:-300}
has() { [[ " $PARTS " == *" $1 "* ]]; }
# The real-text corpus of the training runs: the Python standard library's sources as bytes (60 MB), in $corpus.
make_corpus() {
  corpus="$OUT/corpus.txt"
  [[ -s "$corpus" ]] || find /usr/lib/python3* -name '*.py' -size +4k 2>/dev/null | sort | head -4000 | xargs cat 2>/dev/null \
    | head -c 60000000 >"$corpus"
}
export PYTHONUNBUFFERED=1
# DeepSpeed and its missing dependencies, from the wheels carried in .whl. Fails only when there are
# none; a failed install shows in pip's output and in the DeepSpeed run's import error.
# `install_wheels clients` leaves DeepSpeed out: transformers imports whatever DeepSpeed it finds.
# PyPI ships DeepSpeed as a source distribution only; its wheel (pure Python, its ops compiled when
# first used) is built beside the checkout:
#   .venv/bin/pip install wheel && DS_BUILD_OPS=0 .venv/bin/pip wheel deepspeed==0.19.8 --no-deps \
#     --no-build-isolation -w .whl
#   .venv/bin/pip download --no-deps --python-version 3.12 --only-binary :all: \
#     --platform manylinux2014_x86_64 -d .whl hjson einops msgpack py-cpuinfo ninja
install_wheels() {
  compgen -G ".whl/*.whl" >/dev/null || return 1
  local wheels=(.whl/*.whl) site=/tmp/site
  [[ ${1:-} == clients ]] && site=/tmp/site-clients && mapfile -t wheels < <(ls .whl/*.whl | grep -v -e deepspeed -e hjson)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "${wheels[@]}" \
    && export PYTHONPATH=$site
  return 0
}

prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
# Debian packages the image lacks, carried as .debs and unpacked aside: libgloo-dev libgloo0
# libcpp-httplib-dev libcpp-httplib0.11 libjs-chart.js libssl-dev libicu-dev libicu72
# libsentencepiece-dev libsentencepiece0 libhwloc-dev libhwloc15 libgtest-dev libgmock-dev liburing-dev
# liburing2 (`apt-get download` them). Without libicu72 the link takes ICU's static archive and fails on
# icudt72_dat; a build folder configured so keeps that choice until its CMakeCache.txt goes.
if compgen -G ".debs/*.deb" >/dev/null; then
  for f in .debs/*.deb; do dpkg -x "$f" /tmp/debs; done
  prefix="$prefix;/tmp/debs/usr"
  export LD_LIBRARY_PATH=/tmp/debs/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export TANDEM_CHARTJS=/tmp/debs/usr/share/javascript/chart.js/chart.min.js
fi
cmake_extra=()
if [ ! -f /usr/include/openssl/evp.h ] && [ -f /tmp/debs/usr/include/openssl/evp.h ]; then
  # OpenSSL's headers from the carried libssl-dev, the machine's own libcrypto.
  cmake_extra+=(-DOPENSSL_INCLUDE_DIR=/tmp/debs/usr/include -DOPENSSL_CRYPTO_LIBRARY="$(ls /usr/lib/x86_64-linux-gnu/libcrypto.so.3)"
                -DCMAKE_CXX_FLAGS=-isystem\ /tmp/debs/usr/include/x86_64-linux-gnu)
fi
# The transformers fixtures of the C++ tests run in TANDEM_PYTHON (.venv/bin/python, which setup.sh
# makes); where that venv is missing, the image's python3 (which has transformers) stands in.
if [ ! -x .venv/bin/python ]; then
  mkdir -p .venv/bin
  printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" >.venv/bin/python
  chmod +x .venv/bin/python
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit --format=csv | tee "$OUT/gpu.txt"
if [[ -z ${NO_BUILD:-} ]]; then  # NO_BUILD=1: $BUILD as an earlier call left it (runs beside another call)
echo "== build"
t0=$(date +%s)
cmake -G Ninja -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DTANDEM_TEST_DIRS="${TEST_DIRS:-}" "${cmake_extra[@]}" >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
grep -E "^-- tandem:" "$OUT/cmake.log"
# BUILD_TARGETS: only these (e.g. "tandem tandem_python" when the C++ tests are not run); TEST_DIRS="serve":
# tandem_tests of the tests under tests/serve only (with CTEST_ARGS="-R Serve" for a quick GPU check).
# shellcheck disable=SC2086
ninja -C "$BUILD" ${BUILD_TARGETS:-} >"$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
fi

test_rc=0
if has tests; then
echo "== tests"
# Eight tests at a time with two intra-op threads each: no oversubscription of the 16 cores.
(cd "$BUILD" && OMP_NUM_THREADS=2 ctest --output-on-failure -j8 --timeout 600 ${CTEST_ARGS:-}) >"$OUT/ctest.log" 2>&1
test_rc=$?
grep -E "tests passed|Failed|\*\*\*|Skipped" "$OUT/ctest.log" | tail -20
fi

if has optim; then
echo "== optimizer benchmark: 256M and 1B params, $(nproc) threads, tandem and peers alternating"
install_wheels
lscpu | grep -E "Model name|^CPU\(s\)|Thread|Core|MHz" | tee "$OUT/cpu.txt"
rm -f "$OUT/optim-tandem.jsonl" "$OUT/optim-peers.jsonl"
for i in $(seq "${OPTIM_ROUNDS:-2}"); do
  "$BUILD/tandem" bench optim --params "${OPTIM_PARAMS:-256M,1B}" --repeats 7 --warmup 2 --isa avx2,avx512,scalar \
    --json "$OUT/optim-tandem.jsonl" >"$OUT/optim-tandem-$i.log" 2>&1 || tail -5 "$OUT/optim-tandem-$i.log"
  python3 bench/optim_peers.py --params "${OPTIM_PARAMS:-256M,1B}" --repeats 7 --warmup 2 --threads "$(nproc)" \
    --json "$OUT/optim-peers.jsonl" >"$OUT/optim-peers-$i.log" 2>&1 || tail -5 "$OUT/optim-peers-$i.log"
done
grep -iE "deepspeed|diff" "$OUT/optim-peers-1.log" | head -4
fi

if has train; then
echo "== benchmark: 1B, bf16, B=8, T=2048, $STEPS steps per run"
common=(-p 1B --set train.precision=bf16 --set train.micro_batch=8 --set train.seq_len=2048 --steps "$STEPS"
        --set train.eval_every=0 --set train.save_final=false --set optim.warmup_steps=5 --set train.progress=lines
        --set train.log_every=10)
tandem_runs=() pytorch_runs=()
for i in 1 2; do
  "$BUILD/tandem" train "${common[@]}" --run-dir "$OUT/tandem-1b-$i" 2>&1 | tail -3
  tandem_runs+=("$OUT/tandem-1b-$i")
  python3 bench/pytorch_llama.py --model-config "$OUT/tandem-1b-1/model_config.json" --batch 8 --seq 2048 \
    --steps "$STEPS" --json "$OUT/pytorch-1b-$i.json" | tail -1
  pytorch_runs+=("$OUT/pytorch-1b-$i.json")
done

fi

if has hardening; then
# Plans refused up front on the GPU machine (Note [Host fit]): each must exit 2 in seconds with one line.
echo "== hardening: runs that cannot fit are refused before anything is built"
for args in "-p 7B --set train.precision=bf16" \
            "-p 13B --set offload.optimizer=cpu --set offload.host_memory_gib=16" \
            "-p 1B --set train.micro_batch=500000"; do
  t0=$(date +%s%N)
  # shellcheck disable=SC2086
  "$BUILD/tandem" train $args --run-dir "$OUT/refused" >"$OUT/refused.log" 2>&1
  rc=$?
  printf 'refused (rc %s, %s ms): %s\n  %s\n' "$rc" "$((($(date +%s%N) - t0) / 1000000))" "$args" "$(tail -1 "$OUT/refused.log")"
done
fi

if has bk; then
echo "== BK-core benchmark"
rm -f "$OUT/bk_core.jsonl"
"$BUILD/tandem" bench bk_core --repeats 5 --json "$OUT/bk_core.jsonl" >"$OUT/bk_core.log" 2>&1 || tail -5 "$OUT/bk_core.log"
echo "== ResNet-BK 125M and LLaMA 125M: bf16, B=8, T=1024, $BK_STEPS steps, synthetic corpus"
for p in bk-125M 125M; do
  "$BUILD/tandem" train -p "$p" --set train.precision=bf16 --set train.micro_batch=8 --set train.seq_len=1024 \
    --steps "$BK_STEPS" --set train.eval_every=0 --set train.save_final=false --set train.progress=lines \
    --set train.log_every=25 --run-dir "$OUT/train-$p" >"$OUT/train-$p.log" 2>&1 || tail -5 "$OUT/train-$p.log"
done
fi

if has offload; then
# A real text corpus with no download: the Python standard library's sources on the machine
# (byte-level tokens). Its loss settles near 1.5 nats instead of memorising toward 0.
make_corpus
echo "corpus: $(du -h "$corpus" | cut -f1) of Python sources"
off=(--set train.precision=bf16 --set train.eval_every=0 --set train.save_final=false --set train.progress=lines)
a125=(-p 125M "${off[@]}" --set train.micro_batch=8 --set train.seq_len=1024 --steps "$OFF_STEPS" --set train.log_every=100
      --set data.path="$corpus")
echo "== offload: 125M, bf16, B=8, T=1024, $OFF_STEPS steps, Python-source corpus"
# Deterministic kernels: the GPU-only run repeats itself bit for bit, so what differs between the
# engine and GPU-only AdamW is the engine. Then the same without: the GPU-only noise floor.
run125() { local name=$1; shift; "$BUILD/tandem" train "${a125[@]}" "$@" --run-dir "$OUT/$name" >"$OUT/$name.log" 2>&1 || tail -5 "$OUT/$name.log"; }
run125 off125-gpu --set train.deterministic=true
run125 off125-gpu2 --set train.deterministic=true
run125 off125-k0 --set train.deterministic=true --set offload.optimizer=cpu --set offload.update_split=0
run125 off125-k0.5 --set train.deterministic=true --set offload.optimizer=cpu --set offload.update_split=0.5
run125 off125-delayed --set train.deterministic=true --set offload.optimizer=cpu --set offload.update_split=0 --set offload.delayed_update=true
# The same pair at a learning rate usual for 125M models (6e-4): the trajectories are less chaotic.
run125 off125-gpu-lr6 --set train.deterministic=true --set optim.lr=6e-4
run125 off125-k0-lr6 --set train.deterministic=true --set optim.lr=6e-4 --set offload.optimizer=cpu --set offload.update_split=0
run125 off125-nd1
run125 off125-nd2
grep -hiE "nondeterministic|does not have a deterministic" "$OUT"/off125-*.log | sort | uniq -c | head -5
if [[ ${OFF_1B:-1} == 1 ]]; then
echo "== offload: 1B, bf16, B=8, T=2048, 20 steps: GPU-only, offload k=0, k=auto"
"$BUILD/tandem" train -p 1B "${off[@]}" --set train.micro_batch=8 --set train.seq_len=2048 --steps 20 \
  --set train.log_every=10 --run-dir "$OUT/off1b-gpu" >"$OUT/off1b-gpu.log" 2>&1 || tail -5 "$OUT/off1b-gpu.log"
for k in 0 auto; do
  "$BUILD/tandem" train -p 1B "${off[@]}" --set train.micro_batch=8 --set train.seq_len=2048 --steps 20 \
    --set train.log_every=10 --set offload.optimizer=cpu --set offload.update_split=$k --set offload.trace_steps=12,13 \
    --run-dir "$OUT/off1b-k$k" >"$OUT/off1b-k$k.log" 2>&1 || tail -5 "$OUT/off1b-k$k.log"
  grep -E "update split" "$OUT/off1b-k$k.log" | tail -1
done
fi
fi

if has big; then
# OFFLOAD_BIG (default 7B), bf16, checkpointing, B=8, T=2048: the forward+backward bound, the
# engine exact (updates after the norm), speculative (spec, specnoclip) and delayed, and DeepSpeed
# ZeRO-2 with offload_optimizer=cpu on the identical architecture.
BIG=${OFFLOAD_BIG:-7B}
BIG_STEPS=${BIG_STEPS:-12}
BIG_PARTS=${BIG_PARTS:-bound exact delayed deepspeed}
big_has() { [[ " $BIG_PARTS " == *" $1 "* ]]; }
bigargs=(-p "$BIG" --set train.precision=bf16 --set train.micro_batch=${BIG_BATCH:-8} --set train.seq_len=2048
         --set model.checkpointing=true --set optim.lr=${BIG_LR:-3e-4})
bigset=()  # BIG_SET="key=value ..." adds settings to the engine runs (e.g. optim.state_dtype=bf16)
for kv in ${BIG_SET:-}; do bigset+=(--set "$kv"); done
if big_has bound; then
echo "== $BIG: forward+backward bound"
rm -f "$OUT/big-bound.jsonl"
"$BUILD/tandem" bench step "${bigargs[@]}" --steps 6 --json "$OUT/big-bound.jsonl" --model-json "$OUT/big-bound.json" 2>&1 | tail -1
fi
for mode in exact exactfp32 spec specnoclip delayed; do
  big_has $mode || continue
  extra=(--set offload.speculate=never "${bigset[@]}")
  [[ $mode == delayed ]] && extra+=(--set offload.delayed_update=true)
  # spec: every step speculative (a clipped one solved back through the ring: Note [Retraction]);
  # specnoclip: the same without clipping, so no step is taken back (kAuto's steady state).
  [[ $mode == spec* ]] && extra+=(--set offload.speculate=always)
  [[ $mode == specnoclip ]] && extra+=(--set train.grad_clip=0)
  # exactfp32: the GPU-updated Blocks' states in fp32, as before Note [Device Adam], for the A/B.
  [[ $mode == exactfp32 ]] && extra+=(--set optim.device_state_dtype=fp32)
  echo "== $BIG: offload engine, $mode, $BIG_STEPS steps"
  # The traced step starts and ends with every update done (Note [Offload trace]), which slows it and
  # the step after it: it comes after the measured steps (5 to BIG_STEPS), two more steps in all.
  "$BUILD/tandem" train "${bigargs[@]}" --set train.eval_every=0 --set train.save_final=false --set train.progress=lines \
    --steps $((BIG_STEPS + 2)) --set train.log_every=1 --set offload.optimizer=cpu --set offload.trace_steps=$((BIG_STEPS + 1)) \
    "${extra[@]}" --run-dir "$OUT/big-$mode" >"$OUT/big-$mode.log" 2>&1 || tail -8 "$OUT/big-$mode.log"
  grep -E "offload:|update split|done|error" "$OUT/big-$mode.log"
  python3 - "$OUT/big-$mode/metrics.jsonl" "$mode" "$BIG_STEPS" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
late = [r for r in rows if 5 <= r["step"] <= int(sys.argv[3])]
if late:
    print("%s: median step %.3f s over steps %d-%d, %.0f tokens/s, k %.2f, CPU update %.3f s, rollbacks %s, "
          "grad norms %s" % (
        sys.argv[2], statistics.median(r["step_time_s"] for r in late), late[0]["step"], late[-1]["step"],
        statistics.median(r["tokens_per_s"] for r in late), late[-1].get("offload_k", float("nan")),
        statistics.median(r.get("time_cpu_update_s", 0) for r in late), late[-1].get("offload_rollbacks", "-"),
        " ".join("%.2f" % r.get("grad_norm", float("nan")) for r in rows)))
    print("%s steps: %s" % (sys.argv[2], " ".join("%.3f" % r["step_time_s"] for r in rows)))
PY
done
if big_has deepspeed && install_wheels; then
  echo "== $BIG: DeepSpeed ZeRO-2, offload_optimizer=cpu"
  rm -f "$OUT/big-deepspeed.jsonl"
  python3 bench/deepspeed_offload.py --model-config "$OUT/big-bound.json" --batch "${BIG_BATCH:-8}" --seq 2048 \
    --steps 8 --warmup 3 --checkpointing --json "$OUT/big-deepspeed.jsonl" >"$OUT/big-deepspeed.log" 2>&1
  tail -2 "$OUT/big-deepspeed.log"
fi
fi

if has actoff; then
BIG=${OFFLOAD_BIG:-7B}
actargs=(-p "$BIG" --set train.precision=bf16 --set train.micro_batch=${BIG_BATCH:-8} --set train.seq_len=2048
         --set optim.lr=${BIG_LR:-3e-4})
rm -f "$OUT/actoff.jsonl"
echo "== $BIG: forward+backward, activations recomputed, offloaded or kept"
for n in ${ACT_LAYERS:-0 8 16 24 32}; do
  "$BUILD/tandem" bench step "${actargs[@]}" --set model.checkpointing=true --set model.activation_offload="$n" \
    --steps 6 --json "$OUT/actoff.jsonl" >"$OUT/actoff-$n.log" 2>&1; tail -1 "$OUT/actoff-$n.log"
done
if [[ ${ACT_KEEP:-1} == 1 ]]; then  # ACT_KEEP=0 leaves out the run that keeps every activation
  "$BUILD/tandem" bench step "${actargs[@]}" --set model.checkpointing=false --steps 6 --json "$OUT/actoff.jsonl" \
    >"$OUT/actoff-keep.log" 2>&1; tail -1 "$OUT/actoff-keep.log"
fi
actset=()
for kv in ${BIG_SET:-}; do actset+=(--set "$kv"); done
for n in ${ACT_ENGINE-0 16}; do
  echo "== $BIG: offload engine exact, activations of $n layers offloaded"
  "$BUILD/tandem" train "${actargs[@]}" --set model.checkpointing=true --set model.activation_offload="$n" \
    --set train.eval_every=0 --set train.save_final=false --set train.progress=lines --steps "${BIG_STEPS:-12}" \
    --set train.log_every=1 --set offload.optimizer=cpu --set offload.speculate=never "${actset[@]}" \
    --run-dir "$OUT/actoff-engine-$n" >"$OUT/actoff-engine-$n.log" 2>&1 || tail -5 "$OUT/actoff-engine-$n.log"
  grep -E "offload:|update split|error" "$OUT/actoff-engine-$n.log" | tail -3
  python3 - "$OUT/actoff-engine-$n/metrics.jsonl" "$n" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
late = [r for r in rows if r["step"] >= 5]
if late:
    print("exact, %s layers offloaded: median step %.3f s over steps %d-%d, %.0f tokens/s, losses %s" % (
        sys.argv[2], statistics.median(r["step_time_s"] for r in late), late[0]["step"], late[-1]["step"],
        statistics.median(r["tokens_per_s"] for r in late), " ".join("%.3f" % r["loss"] for r in rows)))
PY
done
fi

if has curve; then
# Convergence on real text (the Python sources as bytes), 1B, B=8, T=1024, CURVE_STEPS (default 320)
# steps, the recipe's defaults: GPU-only AdamW, the offload engine at k = 0 (bf16 host states, a
# 4-slot host ring) exact, the same delayed, and (CURVE_RUNS may add) int8: exact with 8-bit host
# states (Note [8-bit states]), delayedN: N exact updates, then delayed (offload.delayed_after=N),
# bf16sr / bf16kahan: exact with a bf16 master (Note [bf16 master]), int8sr: both 8-bit states and a
# stochastically rounded bf16 master (4 bytes a parameter on the host), int8st: 8-bit states whose
# codes are rounded stochastically (Note [8-bit stochastic codes]), int8srst: int8sr so rounded.
# bench/train_curves.py tabulates them.
make_corpus
cur=(-p 1B --set train.precision=bf16 --set train.micro_batch=8 --set train.seq_len=1024 --steps "${CURVE_STEPS:-320}"
     --set train.eval_every=0 --set train.save_final=false --set train.progress=lines --set train.log_every=40
     --set data.path="$corpus")
ring=(--set offload.optimizer=cpu --set offload.update_split=0 --set optim.state_dtype=bf16 --set offload.host_ring=4
      --set offload.speculate=never)
for c in ${CURVE_RUNS:-gpu exact delayed}; do
  extra=()
  [[ $c != gpu ]] && extra=("${ring[@]}")
  # spec: exact, speculating through the ring once 8 steps in a row did not clip (Note [Retraction]).
  [[ $c == spec ]] && extra=("${ring[@]/offload.speculate=never/offload.speculate=auto}")
  [[ $c == delayed ]] && extra+=(--set offload.delayed_update=true)
  [[ $c =~ ^delayed([0-9]+)$ ]] && extra+=(--set offload.delayed_update=true --set offload.delayed_after="${BASH_REMATCH[1]}")
  [[ $c == int8 ]] && extra+=(--set optim.state_dtype=int8)
  # Note [bf16 master]: bf16sr / bf16kahan with the bf16 host states above, int8sr with 8-bit ones.
  [[ $c == bf16sr || $c == int8sr ]] && extra+=(--set optim.master_dtype=bf16 --set optim.master_rounding=stochastic)
  [[ $c == bf16kahan ]] && extra+=(--set optim.master_dtype=bf16 --set optim.master_rounding=kahan)
  [[ $c == int8sr || $c == int8srst ]] && extra+=(--set optim.state_dtype=int8)
  [[ $c == int8srst ]] && extra+=(--set optim.master_dtype=bf16 --set optim.master_rounding=stochastic)
  [[ $c == int8st || $c == int8srst ]] && extra+=(--set optim.state_dtype=int8 --set optim.state_rounding=stochastic)
  echo "== curve: 1B $c"
  "$BUILD/tandem" train "${cur[@]}" "${extra[@]}" --run-dir "$OUT/curve-$c" >"$OUT/curve-$c.log" 2>&1 || tail -5 "$OUT/curve-$c.log"
  grep -E "recipe|lr |offload:|done" "$OUT/curve-$c.log" | head -4
  python3 - "$OUT/curve-$c/metrics.jsonl" "$c" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
norms = sorted(r["grad_norm"] for r in rows if "grad_norm" in r)
if norms:
    q = lambda f: norms[min(len(norms) - 1, int(f * len(norms)))]
    print("%s: grad norm min %.3f, median %.3f, 90th %.3f, max %.3f; %d of %d steps above 1; speculative steps %s, "
          "rollbacks %s" % (sys.argv[2], norms[0], q(0.5), q(0.9), norms[-1], sum(n > 1 for n in norms), len(norms),
                            rows[-1].get("offload_speculative_steps", "-"), rows[-1].get("offload_rollbacks", "-")))
PY
done
fi

if has capacity; then
# The largest model one GPU trains with the host tier at 4 bytes a parameter (a bf16 master rounded
# stochastically and 8-bit states, Note [bf16 master]): the most of CAP_LAYERS (default "44 42 40 38")
# layers of LLaMA-30B's width (44: 24.0 B) that `tandem inspect --plan` admits, every Block
# CPU-updated, B=1 x CAP_M (default 4) micro-batches of 2048 tokens, CAP_STEPS (default 50) steps on
# the Python sources as bytes. Each size's plan is kept, so the first refused one shows why; CAP_SET
# adds settings (e.g. optim.master_dtype=fp32 for the fp32 master's largest).
make_corpus
cap=(-p 13B --set model.d_model=6656 --set model.n_head=52 --set model.n_kv_head=52 --set model.d_ff=17920
     --set model.tie_embeddings=false --set train.precision=bf16 --set train.micro_batch=1
     --set train.grad_accum="${CAP_M:-4}" --set train.seq_len=2048 --set model.checkpointing=true
     --set offload.optimizer=cpu --set offload.update_split=0 --set optim.state_dtype=int8
     --set optim.master_dtype=bf16 --set optim.master_rounding=stochastic --set optim.lr=1e-4 --set optim.warmup_steps=10)
for kv in ${CAP_SET:-}; do cap+=(--set "$kv"); done
echo "== capacity: layers of d 6656 on one GPU, $(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1048576 )) GiB host, $(( $(awk '/MemAvailable/ {print $2}' /proc/meminfo) / 1048576 )) GiB available"
layers=""
for L in ${CAP_LAYERS:-44 42 40 38}; do
  "$BUILD/tandem" inspect "${cap[@]}" --set model.n_layer="$L" --plan >"$OUT/capacity-plan-$L.log" 2>&1
  rc=$?
  echo "$L layers: $(grep -E '^parameters' "$OUT/capacity-plan-$L.log" | cut -c1-40) plan rc $rc"
  grep -E "master|budget|error" "$OUT/capacity-plan-$L.log" | cut -c1-300
  if (( rc == 0 )); then layers=$L; break; fi
done
if [[ -n $layers ]]; then
  timeout "${CAP_TIMEOUT:-480}" "$BUILD/tandem" train "${cap[@]}" --set model.n_layer="$layers" --steps "${CAP_STEPS:-50}" \
    --set data.path="$corpus" --set train.eval_every=0 --set train.save_final=false --set train.progress=lines \
    --set train.log_every=5 --run-dir "$OUT/capacity-$layers" >"$OUT/capacity-$layers.log" 2>&1 &
  cap_pid=$!
  peak=0
  while kill -0 $cap_pid 2>/dev/null; do
    used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 2>/dev/null | head -1)
    (( ${used:-0} > peak )) && peak=$used
    sleep 5
  done
  wait $cap_pid; echo "capacity run rc $?; GPU memory in use at most ${peak} MiB"
  grep -E "offload: .*plan|start-up|pinned|done:|loss" "$OUT/capacity-$layers.log" | tail -16 | cut -c1-240
fi
fi

if has nvme; then
# Note [NVMe tier]: the disk's bound, then the same 7B run with and without half its Blocks' states on
# the tier. The GPU machine's disk is 64 GiB: 8-bit states of 16 blocks are about 3.3 GB, fp32 ones 13 GB.
nv_dir=${NVME_DIR:-/tmp/tandem-nvme}
echo "== nvme: the disk under $nv_dir ($(df -h --output=size,avail "$(dirname "$nv_dir")" | tail -1))"
"$BUILD/tandem" bench nvme --dir "$nv_dir" --gib "${NVME_GIB:-8}" --json "$OUT/nvme-bench.jsonl" 2>&1 | tail -4
nv=(-p 7B --set train.precision=bf16 --set train.micro_batch=8 --set train.seq_len=2048 --set model.checkpointing=true
    --set offload.optimizer=cpu --set offload.speculate=never --set optim.state_dtype="${NVME_STATES:-int8}"
    --steps "${NVME_STEPS:-12}" --set train.eval_every=0 --set train.save_final=false --set train.progress=lines
    --set train.log_every=1)
for kv in ${NVME_SET:-}; do nv+=(--set "$kv"); done  # e.g. offload.update_split=0: every Block CPU-updated
for side in host tier; do
  extra=()
  [[ $side == tier ]] && extra=(--set offload.nvme_path="$nv_dir" --set offload.nvme_blocks="${NVME_BLOCKS:-16}")
  echo "== nvme: 7B, states on the $side"
  "$BUILD/tandem" train "${nv[@]}" "${extra[@]}" --run-dir "$OUT/nvme-$side" >"$OUT/nvme-$side.log" 2>&1 \
    || tail -5 "$OUT/nvme-$side.log"
  grep -E "offload: .*(plan|NVMe)|done" "$OUT/nvme-$side.log" | cut -c1-240
  python3 - "$OUT/nvme-$side/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l][3:]
if rows:
    f = lambda k: sum(r.get(k, 0) for r in rows) / len(rows)
    print("steps 4..: step %.3f s, %.0f tokens/s, CPU update %.3f s, waiting for reads %.3f s, read %.2f GB, written %.2f GB"
          % (f("step_time_s"), f("tokens_per_s"), f("time_cpu_update_s"), f("time_nvme_wait_s"),
             f("nvme_read_bytes") / 1e9, f("nvme_written_bytes") / 1e9))
PY
done
fi

if has telemetry; then
# The sampler's cost and energy per token: 1B GPU-only, sampler on and off alternating.
echo "== telemetry: 1B, bf16, B=8, T=2048, $STEPS steps per run, monitor.enabled on/off"
tel=(-p 1B --set train.precision=bf16 --set train.micro_batch=8 --set train.seq_len=2048 --steps "$STEPS"
     --set train.eval_every=0 --set train.save_final=false --set train.progress=lines --set train.log_every=10)
tel_on=() tel_off=()
for i in 1 2; do
  "$BUILD/tandem" train "${tel[@]}" --run-dir "$OUT/tel-on-$i" >"$OUT/tel-on-$i.log" 2>&1 || tail -3 "$OUT/tel-on-$i.log"
  "$BUILD/tandem" train "${tel[@]}" --set monitor.enabled=false --run-dir "$OUT/tel-off-$i" >"$OUT/tel-off-$i.log" 2>&1 \
    || tail -3 "$OUT/tel-off-$i.log"
  tel_on+=("$OUT/tel-on-$i") tel_off+=("$OUT/tel-off-$i")
done
grep -hE "telemetry:|energy:" "$OUT/tel-on-1.log"
echo "== live: 1B offload (k auto), dashboard + /metrics on 127.0.0.1:8601, TensorBoard, trace of steps 20-21"
live="$OUT/live-1b"
"$BUILD/tandem" train -p 1B --set train.precision=bf16 --set train.micro_batch=8 --set train.seq_len=2048 \
  --steps "${LIVE_STEPS:-80}" --set train.eval_every=20 --set train.save_final=false --set train.progress=lines \
  --set train.log_every=20 --set offload.optimizer=cpu --set offload.trace_steps=20,21 \
  --set monitor.chartjs="${TANDEM_CHARTJS:-}" --dashboard 8601 --metrics-port 8601 --tensorboard \
  --run-dir "$live" >"$OUT/live-1b.log" 2>&1 &
live_pid=$!
polls=0
while kill -0 $live_pid 2>/dev/null; do
  sleep 5
  if curl -sf "http://127.0.0.1:8601/api/series?row=0&sample=0" -o "$OUT/live-series.json.tmp"; then
    mv "$OUT/live-series.json.tmp" "$OUT/live-series.json"
    curl -sf http://127.0.0.1:8601/metrics -o "$OUT/live-metrics.txt"
    curl -sf http://127.0.0.1:8601/ -o "$OUT/live-page.html"
    polls=$((polls + 1))
  fi
done
wait $live_pid; echo "live run exit $?, $polls captures while training"
tail -2 "$OUT/live-1b.log"
"$BUILD/tandem" report "$live" && cp "$live/report.html" "$OUT/report-1b.html"
python3 bench/live_run_outputs.py "$live"
fi

if has resilience; then
echo "== resilience: 7B offload at micro-batch ${RES_BATCH:-32} (too large), bf16 states, checkpointing"
"$BUILD/tandem" train -p 7B --set train.precision=bf16 --set train.micro_batch="${RES_BATCH:-32}" \
  --set train.seq_len=2048 --steps 6 --set train.eval_every=0 --set train.save_final=false --set optim.lr=3e-4 \
  --set optim.warmup_steps=2 --set model.checkpointing=true --set offload.optimizer=cpu --set optim.state_dtype=bf16 \
  --set train.progress=lines --set train.log_every=1 --run-dir "$OUT/res-7b" >"$OUT/res-7b.log" 2>&1
echo "7B exit $?"; grep -E "out of memory|starting anyway|step [0-9]+/|done:|error" "$OUT/res-7b.log" | cut -c1-260
echo "== resilience: 1B GPU-resident, 40 steps, a checkpoint at step 20: in the background, then in place"
for mode in true false; do
  "$BUILD/tandem" train -p 1B --set train.precision=bf16 --set train.micro_batch=8 --set train.seq_len=2048 \
    --steps 40 --set train.eval_every=0 --set train.save_final=false --set train.checkpoint_every=20 \
    --set train.async_checkpoint=$mode --set train.progress=lines --set train.log_every=10 \
    --run-dir "$OUT/ckpt-$mode" >"$OUT/ckpt-$mode.log" 2>&1 || tail -3 "$OUT/ckpt-$mode.log"
  python3 bench/checkpoint_cost.py "$OUT/ckpt-$mode" "$mode"
  du -sh "$OUT/ckpt-$mode/checkpoints" | cut -f1; rm -rf "$OUT/ckpt-$mode/checkpoints"
done
fi

if has dist; then
# Weak scaling: train.micro_batch (tandem) and --batch (the peers) are per GPU, so the global batch
# grows with the GPU count n. For n in DIST_NS (default 1 2 4; those above the machine's GPU count
# are left out), tandem first, then its peer:
#   resident  1B GPU-resident, the train part's settings: `tandem train` at n = 1, `tandem launch
#             --nproc-per-node n` above; PyTorch DDP (bench/pytorch_llama.py, under torchrun above 1);
#   offload   DIST_BIG with the big part's settings through the offload engine with sharded fp32
#             masters and Adam states (offload.optimizer=cpu, dist.zero_stage=2), against DeepSpeed
#             ZeRO-2 with offload_optimizer=cpu (bench/deepspeed_offload.py, under torchrun above 1).
# Both sides of a workload leave the same first steps out of their medians (DIST_WARMUP, default 6 of
# DIST_STEPS; DIST_BIG_WARMUP, default 3 of DIST_BIG_STEPS). Each run has a time limit, a rendezvous
# port of its own, OMP_NUM_THREADS = cores / n (what tandem launch gives its workers; torchrun would
# give 1) and its log in $OUT/dist-NAME.log. bench/dist_scaling_table.py records every run in
# $OUT/dist-runs.jsonl and keeps $OUT/dist-scaling.json current, so a call cut short keeps what ran;
# the table script also joins the output folders of several calls (DIST_NS, DIST_PARTS and
# DIST_SIDES split the work when one call would run too long, e.g. 13B start-up takes minutes).
G=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
DIST_STEPS=${DIST_STEPS:-30}
DIST_WARMUP=${DIST_WARMUP:-6}
DIST_BIG=${DIST_BIG:-13B}
DIST_BIG_BATCH=${DIST_BIG_BATCH:-${BIG_BATCH:-8}}
DIST_BIG_STEPS=${DIST_BIG_STEPS:-8}
DIST_BIG_WARMUP=${DIST_BIG_WARMUP:-3}
DIST_PARTS=${DIST_PARTS:-resident offload}
DIST_SIDES=${DIST_SIDES:-tandem peer}
dist_has() { [[ " $DIST_PARTS " == *" $1 "* ]]; }
side_has() { [[ " $DIST_SIDES " == *" $1 "* ]]; }
dist_ns=()
for n in ${DIST_NS:-1 2 4}; do (( n >= 1 && n <= G )) && dist_ns+=("$n"); done
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off on these machines
manifest="$OUT/dist-runs.jsonl"
rm -f "$manifest" "$OUT/dist-scaling.json"
next_port=${DIST_PORT:-29500}
echo "== dist: weak scaling, $G GPUs, n = ${dist_ns[*]:-(none)}, parts: $DIST_PARTS, sides: $DIST_SIDES"

# Sets `port` to the next rendezvous port, once nothing holds it (up to a minute).
dist_next_port() {
  port=$next_port
  next_port=$((next_port + 1))
  local i
  for i in $(seq 60); do
    python3 -c 'import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("", int(sys.argv[1])))' \
      "$port" 2>/dev/null && return 0
    sleep 1
  done
  echo "dist: port $port still taken after 60 s; trying it anyway"
}
# Sets `launch` to the command prefix for n workers: tandem's (`tandem train` for one) or Python's.
dist_tandem() {
  if (( $1 == 1 )); then launch=("$BUILD/tandem" train)
  else launch=("$BUILD/tandem" launch --nproc-per-node "$1" --master-port "$2" -- "$BUILD/tandem" train); fi
}
dist_python() {
  if (( $1 == 1 )); then launch=(python3)
  else launch=(python3 -m torch.distributed.run --nnodes 1 --nproc-per-node "$1" --master-addr 127.0.0.1 --master-port "$2"); fi
}
# Kills what is left of a run, found by the tag in its processes' environment (the launchers start
# their workers in process groups or sessions of their own, out of timeout's reach), and waits for it.
dist_reap() {
  local tag=$1 pids=() p i
  for p in /proc/[0-9]*; do
    grep -qzx "GPU_CHECK_RUN=$tag" "$p/environ" 2>/dev/null && pids+=("${p#/proc/}")
  done
  (( ${#pids[@]} )) || return 0
  echo "dist: killing ${#pids[@]} processes left by $tag: ${pids[*]}"
  kill -KILL "${pids[@]}" 2>/dev/null
  for i in $(seq 30); do kill -0 "${pids[@]}" 2>/dev/null || return 0; sleep 1; done
}
# dist_run NAME WORKLOAD LABEL IMPL N RESULT WARMUP LIMIT COMMAND...: runs COMMAND with its output in
# $OUT/dist-NAME.log, SIGTERM after LIMIT seconds and SIGKILL 30 s later; records it; on failure
# prints the log's last 20 lines.
dist_run() {
  local name=$1 workload=$2 label=$3 impl=$4 n=$5 result=$6 warmup=$7 limit=$8
  shift 8
  local log="$OUT/dist-$name.log" tag="gpu-check-$$-$name" threads=$(( $(nproc) / n )) t0=$SECONDS rc lines
  rm -rf "$result"
  # Each GPU's memory in use as the driver sees it (NCCL's buffers and the CUDA context included),
  # sampled every half second: the peak against the memory plan's GPU tier.
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 500 >"$log.smi" 2>/dev/null &
  local smi=$!
  GPU_CHECK_RUN=$tag OMP_NUM_THREADS=$threads timeout -k 30 "$limit" "$@" >"$log" 2>&1
  rc=$?
  kill "$smi" 2>/dev/null
  dist_reap "$tag"
  awk -F', *' '{ if ($2 > m[$1]) m[$1] = $2 } END { s = ""; for (g in m) s = s sprintf(" GPU %s %.1f GiB", g, m[g] / 1024);
    print "'"$name"': peak memory used (nvidia-smi):" s }' "$log.smi"
  lines=$(wc -l <"$log")
  if (( lines > 400 )); then  # the start-up and the end
    { head -40 "$log"; echo "[... $((lines - 340)) lines left out ...]"; tail -300 "$log"; } >"$log.tmp" && mv "$log.tmp" "$log"
  fi
  OMP_NUM_THREADS=$threads python3 bench/dist_scaling_table.py record "$manifest" --name "$name" --workload "$workload" \
    --label "$label" --impl "$impl" --gpus "$n" --rc "$rc" --wall-s $((SECONDS - t0)) --result "$result" --log "$log" \
    --warmup "$warmup" --json "$OUT/dist-scaling.json" --gpu-txt "$OUT/gpu.txt" -- "$@" || tail -20 "$log"
}

if dist_has resident && (( ${#dist_ns[@]} )); then
  d1b=(-p 1B --set train.precision=bf16 --set train.micro_batch=8 --set train.seq_len=2048 --steps "$DIST_STEPS"
       --set train.eval_every=0 --set train.save_final=false --set optim.warmup_steps=5 --set train.progress=lines
       --set train.log_every=10)
  # The architecture for the peer: `tandem inspect --hf-config` writes it without any GPU work. Else the
  # n = 1 run directory's copy.
  m1b="$OUT/dist-1b-model.json"
  "$BUILD/tandem" inspect -p 1B --hf-config "$m1b" >/dev/null 2>&1
  label="1B GPU-resident, B=8/GPU, T=2048"
  echo "== dist: $label, $DIST_STEPS steps per run, tandem and PyTorch DDP"
  for n in "${dist_ns[@]}"; do
    if side_has tandem; then
      dist_next_port; dist_tandem "$n" "$port"
      dist_run "tandem-1b-n$n" 1b-resident "$label" tandem "$n" "$OUT/dist-tandem-1b-n$n" "$DIST_WARMUP" \
        "${DIST_TIMEOUT:-240}" "${launch[@]}" "${d1b[@]}" --run-dir "$OUT/dist-tandem-1b-n$n"
      [[ -s $m1b ]] || m1b="$OUT/dist-tandem-1b-n$n/model_config.json"
    fi
    if side_has peer; then
      dist_next_port; dist_python "$n" "$port"
      dist_run "pytorch-1b-n$n" 1b-resident "$label" pytorch-ddp "$n" "$OUT/dist-pytorch-1b-n$n.json" "$DIST_WARMUP" \
        "${DIST_TIMEOUT:-240}" "${launch[@]}" bench/pytorch_llama.py --model-config "$m1b" --batch 8 --seq 2048 \
        --steps "$DIST_STEPS" --warmup "$DIST_WARMUP" --json "$OUT/dist-pytorch-1b-n$n.json"
    fi
  done
fi

if dist_has offload && (( ${#dist_ns[@]} )); then
  install_wheels || echo "dist: no wheels in .whl; DeepSpeed must come with the image"
  dbigset=()  # DIST_BIG_SET="key=value ..." adds settings to the tandem runs (e.g. optim.state_dtype=bf16)
  for kv in ${DIST_BIG_SET:-}; do dbigset+=(--set "$kv"); done
  dbig=(-p "$DIST_BIG" --set train.precision=bf16 --set train.micro_batch="$DIST_BIG_BATCH" --set train.seq_len=2048
        --set model.checkpointing=true --set optim.lr="${BIG_LR:-3e-4}")
  mbig="$OUT/dist-big-model.json"
  "$BUILD/tandem" inspect "${dbig[@]}" "${dbigset[@]}" --hf-config "$mbig" >/dev/null 2>&1  # as for 1B
  label="$DIST_BIG offload + ZeRO-2, B=$DIST_BIG_BATCH/GPU, T=2048, checkpointing"
  echo "== dist: $label, $DIST_BIG_STEPS steps per run, tandem and DeepSpeed ZeRO-2 offload_optimizer=cpu"
  for n in "${dist_ns[@]}"; do
    if side_has tandem; then
      dist_next_port; dist_tandem "$n" "$port"
      dist_run "tandem-big-n$n" big-offload "$label" tandem "$n" "$OUT/dist-tandem-big-n$n" "$DIST_BIG_WARMUP" \
        "${DIST_BIG_TIMEOUT:-540}" "${launch[@]}" "${dbig[@]}" --steps "$DIST_BIG_STEPS" --set train.eval_every=0 \
        --set train.save_final=false --set train.progress=lines --set train.log_every=1 --set offload.optimizer=cpu \
        --set offload.speculate=never --set dist.zero_stage=2 "${dbigset[@]}" --run-dir "$OUT/dist-tandem-big-n$n"
      # rank 0's memory plan, start-up time and update split
      grep -E "offload: .*plan:|model built in|update split" "$OUT/dist-tandem-big-n$n.log" | grep -v "^\[rank [1-9]" \
        | head -3 | cut -c1-240
      [[ -s $mbig ]] || mbig="$OUT/dist-tandem-big-n$n/model_config.json"
    fi
    if side_has peer; then
      dist_next_port; dist_python "$n" "$port"
      dist_run "deepspeed-big-n$n" big-offload "$label" deepspeed-zero2-offload "$n" "$OUT/dist-deepspeed-big-n$n.jsonl" \
        "$DIST_BIG_WARMUP" "${DIST_BIG_TIMEOUT:-540}" "${launch[@]}" bench/deepspeed_offload.py --model-config "$mbig" \
        --batch "$DIST_BIG_BATCH" --seq 2048 --steps "$DIST_BIG_STEPS" --warmup "$DIST_BIG_WARMUP" --checkpointing \
        --lr "${BIG_LR:-3e-4}" --json "$OUT/dist-deepspeed-big-n$n.jsonl"
    fi
  done
fi

if dist_has pipeline && (( G >= 2 )); then
  # 1B (untied) in PP_STAGES stages (default 2, at most the GPUs), 1F1B, PP_M micro-batches of PP_B rows:
  # tandem with each cut of PP_CUTS (default "even"; "auto" is the partitioner's cut from its profile)
  # against torch.distributed.pipelining on the same architecture and micro-batching, cut evenly
  # (bench/pipelining_peer.py).
  PP_M=${PP_M:-8} PP_B=${PP_B:-4} PP_STEPS=${PP_STEPS:-12} PP_WARMUP=${PP_WARMUP:-4} PP_STAGES=${PP_STAGES:-2}
  (( PP_STAGES > G )) && PP_STAGES=$G
  dpp=(-p 1B --set model.tie_embeddings=false --set train.precision=bf16 --set train.micro_batch="$PP_B"
       --set train.grad_accum="$PP_M" --set train.seq_len=2048 --steps "$PP_STEPS" --set train.eval_every=0
       --set train.save_final=false --set optim.warmup_steps=5 --set train.progress=lines --set train.log_every=1
       --set dist.pipeline_stages="$PP_STAGES" --set dist.pipeline_schedule=1f1b)
  for kv in ${PP_SET:-}; do dpp+=(--set "$kv"); done
  mpp="$OUT/dist-pp-model.json"
  "$BUILD/tandem" inspect -p 1B --set model.tie_embeddings=false --hf-config "$mpp" >/dev/null 2>&1
  label="1B, $PP_STAGES stages, 1F1B, $PP_M x $PP_B rows x 2048"
  echo "== dist: $label, $PP_STEPS steps, tandem (cuts: ${PP_CUTS:-even}) and torch.distributed.pipelining"
  for cut in ${PP_CUTS:-even}; do
    name="tandem-pp$PP_STAGES-$cut"
    side_has tandem && dist_next_port && dist_tandem "$PP_STAGES" "$port" && \
    dist_run "$name" "pipeline-1b-pp$PP_STAGES" "$label, cut $cut" tandem "$PP_STAGES" "$OUT/dist-$name" "$PP_WARMUP" 240 \
      "${launch[@]}" "${dpp[@]}" --set dist.pipeline_cut="${cut/auto/}" --run-dir "$OUT/dist-$name"
    grep -E "stage [0-9]+ of|predicted step|bubble" "$OUT/dist-$name.log" | grep -v "^\[rank [1-9]" | tail -4 | cut -c1-240
  done
  side_has peer && dist_next_port && dist_python "$PP_STAGES" "$port" && \
  dist_run "pippy-pp$PP_STAGES" "pipeline-1b-pp$PP_STAGES" "$label, cut even" torch-pipelining-1f1b "$PP_STAGES" \
    "$OUT/dist-pippy-pp$PP_STAGES.json" "$PP_WARMUP" 240 \
    "${launch[@]}" bench/pipelining_peer.py --model-config "$mpp" --micro-batch "$PP_B" --micro-batches "$PP_M" \
    --seq 2048 --steps "$PP_STEPS" --warmup "$PP_WARMUP" --schedule 1f1b --json "$OUT/dist-pippy-pp$PP_STAGES.json"
  # Each side's step 4 timed pass by pass on the GPUs (tandem's dist.pipeline_trace_steps default, the
  # peer's --trace-step): busy time, and the gaps between passes on each stage.
  python3 bench/pipeline_gaps.py $(for cut in ${PP_CUTS:-even}; do echo "tandem-$cut=$OUT/dist-tandem-pp$PP_STAGES-$cut/pipeline_trace.json"; done) \
    "peer=$OUT/dist-pippy-pp$PP_STAGES.json.trace.json" | cut -c1-300
fi

if dist_has pp-offload && (( G >= 2 )); then
  # DIST_BIG in 2 even stages through the offload engine (bf16 host states), DIST_BIG_BATCH rows per
  # micro-batch, PPO_M micro-batches: the pipeline's memory plan per stage (Note [Plan layout]).
  PPO_M=${PPO_M:-4}
  dppo=(-p "$DIST_BIG" --set model.tie_embeddings=false --set train.precision=bf16 --set train.micro_batch="$DIST_BIG_BATCH"
        --set train.grad_accum="$PPO_M" --set train.seq_len=2048 --set model.checkpointing=true --set optim.lr="${BIG_LR:-3e-4}"
        --steps "$DIST_BIG_STEPS" --set train.eval_every=0 --set train.save_final=false --set train.progress=lines
        --set train.log_every=1 --set offload.optimizer=cpu --set optim.state_dtype=bf16 --set dist.pipeline_stages=2
        --set dist.pipeline_cut=even)
  for kv in ${DIST_BIG_SET:-}; do dppo+=(--set "$kv"); done
  label="$DIST_BIG offload, 2 stages, 1F1B, $PPO_M x $DIST_BIG_BATCH rows x 2048, checkpointing"
  echo "== dist: $label, $DIST_BIG_STEPS steps"
  dist_next_port; dist_tandem 2 "$port"
  dist_run "tandem-pp-offload" big-pp-offload "$label" tandem 2 "$OUT/dist-tandem-pp-offload" "$DIST_BIG_WARMUP" \
    "${DIST_BIG_TIMEOUT:-540}" "${launch[@]}" "${dppo[@]}" --run-dir "$OUT/dist-tandem-pp-offload"
  grep -E "offload: .*plan|model built in|bubble" "$OUT/dist-tandem-pp-offload.log" | tail -5 | cut -c1-260
fi

if dist_has largest && (( G >= 2 )); then
  # The largest model the plan admits on this machine among LARGEST_LAYERS (default "56 54 52") layers of
  # LLaMA-30B's width (56: 30.4 B), in 2 stages with the offload engine (bf16 host states), on the Python
  # sources as bytes, LARGEST_STEPS (default 50) steps; each size's plan (tandem inspect --plan --ranks 2)
  # is kept, so the first refused one shows why. LARGEST_SET adds settings (e.g. offload.gpu_memory_fraction
  # to plan an 80 GB GPU on a larger one).
  make_corpus
  big=(-p 13B --set model.d_model=6656 --set model.n_head=52 --set model.n_kv_head=52 --set model.d_ff=17920
       --set model.tie_embeddings=false --set train.precision=bf16 --set train.micro_batch=1
       --set train.grad_accum="${LARGEST_M:-4}" --set train.seq_len=2048 --set model.checkpointing=true
       --set offload.optimizer=cpu --set optim.state_dtype=bf16 --set dist.pipeline_stages=2 --set dist.pipeline_cut=even
       --set optim.lr=1e-4 --set optim.warmup_steps=10)
  for kv in ${LARGEST_SET:-}; do big+=(--set "$kv"); done
  echo "== largest: layers of d 6656 in 2 stages, $(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1048576 )) GiB host, $(( $(awk '/MemAvailable/ {print $2}' /proc/meminfo) / 1048576 )) GiB available"
  layers=""
  for L in ${LARGEST_LAYERS:-56 54 52}; do
    "$BUILD/tandem" inspect "${big[@]}" --set model.n_layer="$L" --plan --ranks 2 >"$OUT/largest-plan-$L.log" 2>&1
    rc=$?
    echo "$L layers: $(grep -E '^parameters' "$OUT/largest-plan-$L.log" | cut -c1-40) plan rc $rc"
    grep -E "GPU-updated, |budget|error" "$OUT/largest-plan-$L.log" | cut -c1-300
    if (( rc == 0 )); then layers=$L; break; fi
  done
  if [[ -n $layers ]]; then
    dist_next_port; dist_tandem 2 "$port"
    dist_run "tandem-largest" largest "largest: $layers x d 6656, 2 stages, offload" tandem 2 \
      "$OUT/dist-tandem-largest" 5 "${LARGEST_TIMEOUT:-560}" "${launch[@]}" "${big[@]}" --set model.n_layer="$layers" \
      --steps "${LARGEST_STEPS:-50}" --set data.path="$corpus" --set train.eval_every=0 --set train.save_final=false \
      --set train.progress=lines --set train.log_every=5 --run-dir "$OUT/dist-tandem-largest"
    grep -E "offload: .*plan|start-up|done:|loss" "$OUT/dist-tandem-largest.log" | tail -16 | cut -c1-240
  fi
fi
fi

if has python; then
echo "== python package: its tests on the GPU, then tandem.Engine against its peers (bench/python_engine.py)"
install_wheels || echo "python: no wheels in .whl; torchao must come with the image"
pyenv="PYTHONPATH=$PWD/$BUILD/python${PYTHONPATH:+:$PYTHONPATH}"
if [ "${PY_TESTS:-1}" = 1 ]; then
  (cd tests/python && env "$pyenv" TANDEM_CLI="$PWD/../../$BUILD/tandem" OMP_NUM_THREADS=2 \
    python3 -m pytest -q -p no:cacheprovider -x .) >"$OUT/pytest.log" 2>&1
  tail -3 "$OUT/pytest.log"
fi
for part in ${PY_PARTS-resident offload}; do  # PY_PARTS="" runs none
  rm -f "$OUT/py-$part.jsonl"
  if [ "$part" = resident ]; then
    env "$pyenv" python3 bench/python_engine.py resident --preset "${PY_RES_PRESET:-1B}" --batch "${PY_RES_BATCH:-8}" \
      --seq 2048 --cli "$BUILD/tandem" --json "$OUT/py-resident.jsonl" >"$OUT/py-resident.log" 2>&1
  else
    env "$pyenv" python3 bench/python_engine.py offload --preset "${PY_OFF_PRESET:-7B}" --batch "${PY_OFF_BATCH:-8}" \
      --seq 2048 --checkpointing --peers "${PY_OFF_PEERS:-cli,torchao}" --cli "$BUILD/tandem" \
      --json "$OUT/py-offload.jsonl" >"$OUT/py-offload.log" 2>&1
  fi
  tail -4 "$OUT/py-$part.log"
done
fi

if has trainer; then
# transformers' Trainer fine-tuning a Mistral-7B-shaped model (TR_SHAPE, TR_BATCH x TR_SEQ, default 4 x 4096,
# gradient checkpointing) with tandem's OffloadAdamW, torchao's CPUOffloadOptimizer and DeepSpeed ZeRO-2
# offload through the Trainer's deepspeed= argument, each side a process of its own, with the model's
# forward+backward bound (bench/trainer_peers.py). torchao and DeepSpeed come from the wheels in .whl.
echo "== trainer: transformers.Trainer with tandem, torchao and DeepSpeed offload (bench/trainer_peers.py)"
install_wheels || echo "trainer: no wheels in .whl (torchao and DeepSpeed must come with the image)"
rm -f "$OUT/trainer.jsonl"
env PYTHONPATH="$PWD/$BUILD/python${PYTHONPATH:+:$PYTHONPATH}" python3 bench/trainer_peers.py \
  --shape "${TR_SHAPE:-mistral-7b}" --batch "${TR_BATCH:-4}" --seq "${TR_SEQ:-4096}" --steps "${TR_STEPS:-6}" \
  --warmup "${TR_WARMUP:-3}" --sides "${TR_SIDES:-bound,tandem,torchao,deepspeed}" --timeout "${TR_TIMEOUT:-300}" \
  --state-dtype "${TR_STATE:-fp32}" ${TR_LAYERS:+--layers "$TR_LAYERS"} --json "$OUT/trainer.jsonl" >"$OUT/trainer.log" 2>&1
tail -6 "$OUT/trainer.log"
fi

write_prompts() {  # count, file: numbered prompts of 12 or 13 tokens
  python3 -c "import sys; [print('the model trains on every tier of memory and serves', i) for i in range(int(sys.argv[1]))]" \
    "$1" >"$2"
}

if has serve; then
# Generation and serving on the GPU: a random-weight Llama folder (SERVE_LAYERS, default 22, width 2048:
# 1.0 B parameters), `tandem generate` on a batch of SERVE_BATCH prompts (default 32) resident and
# with all but 4 layers streamed from pinned host memory, transformers' greedy generate on the same
# folder as the peer, `tandem serve` on the same folder under SERVE_CLIENTS closed-loop clients (default
# 64) streaming chat replies of 128 tokens for SERVE_LOAD_S seconds (default 60) on the server's
# defaults and on SERVE_ARGS_B (below), the prefix cache's load (SERVE_PREFIX, default "on off"), then the server's tests with the openai client on this GPU (test_serve.py, test_serve_http.py).
# SERVE_BIG=1 (or only, for this alone) then a model larger than the GPU share it may use: the 13B preset's
# shape with random weights (bench/generate_peer.py make --preset 13B, 26 GB in SERVE_BIG_DIR, default
# /dev/shm/gen-13b where the tmpfs holds it, else /tmp/gen-13b; never under $OUT, and deleted at the end),
# 8 prompts of 32 new tokens, `tandem generate` with --gpu-memory-gib 16 and 6 (21 and 4 of 40 layers
# resident, the rest streamed), then transformers + accelerate (device_map="auto", max_memory 16 GiB on the
# GPU) on the same folder; each command limited to SERVE_BIG_TIMEOUT s (default 180). The summary sets the
# three against the PCIe bound (weight bytes copied a step at 55 GB/s; bench/generate_peer.py table).
# SERVE_EPI_AB=1 (default): a generation of SERVE_AB_BATCHES prompts (default "1"; up to 4 take the
# persistent step) on a folder with each of SERVE_KERNELS (default "separate fused persistent": the
# layered kernels with the products' epilogues apart (Note [Skinny epilogues]), with them (Note [Decode
# step kernels], the default), and the whole step in one launch (Note [Persistent decode step])), twice
# each, alternating: their A/B in one invocation.
epilogue_ab() {  # folder, log prefix
  [[ ${SERVE_EPI_AB:-1} == 1 ]] || return 0
  local round kern batch
  for batch in ${SERVE_AB_BATCHES:-1}; do
    head -"$batch" "$OUT/gen-prompts.txt" >"$OUT/gen-prompt-ab.txt"
    for round in 1 2; do
      for kern in ${SERVE_KERNELS:-separate fused persistent}; do
        TANDEM_DECODE_KERNELS=$kern "$BUILD/tandem" generate --checkpoint "$1" --prompts "$OUT/gen-prompt-ab.txt" \
          --max-tokens 128 --ignore-eos --max-batch "$batch" --kv-cache-gib 1 >"$OUT/$2-$batch-$kern-$round.log" 2>&1
        echo "-- batch $batch, TANDEM_DECODE_KERNELS=$kern (round $round):"
        grep -aE "^decode:|tokens/s|error" "$OUT/$2-$batch-$kern-$round.log" | tail -2
      done
    done
  done
}
serve_load_run() {  # name, serve flags
  rm -f "$OUT/$1.json"
  echo "-- $1: tandem serve ${2:-(defaults)}"
  if python3 bench/serve_load.py --checkpoint "$gdir" --cli "$BUILD/tandem" --server-log "$OUT/$1-server.log" \
       --serve-args "$2" --clients "${SERVE_CLIENTS:-64}" --duration "${SERVE_LOAD_S:-60}" --endpoint chat --stream \
       --max-tokens 128 ${SERVE_LOAD_FLAGS---ignore-eos} --json "$OUT/$1.json" >"$OUT/$1.log" 2>&1; then
    head -1 "$OUT/$1.log"
    grep -aE "KV cache" "$OUT/$1-server.log" | head -1 | cut -c1-300
  else
    grep -aiE "fail|error|HTTP [0-9]|client [0-9]" "$OUT/$1.log" | head -5 | cut -c1-400
    grep -aiE "error|fail|warn|abort|terminate" "$OUT/$1-server.log" | head -10 | cut -c1-400
  fi
}
# The mixed load of a chat service (bench/serve_load.py --mix: each request its own prompt of 20-400
# tokens, max_tokens 16-256, every other request streamed, temperature 0.7), SERVE_LOAD_S seconds on
# the server's defaults; SERVE_MIX=0 leaves it out.
serve_mix_run() {  # name
  [[ ${SERVE_MIX:-1} == 1 ]] || return 0
  python3 bench/serve_load.py --checkpoint "$gdir" --cli "$BUILD/tandem" --server-log "$OUT/$1-server.log" \
    --serve-args "${SERVE_ARGS:-}" --clients "${SERVE_CLIENTS:-64}" --duration "${SERVE_LOAD_S:-60}" --mix \
    --json "$OUT/$1.json" >"$OUT/$1.log" 2>&1 || grep -aiE "fail|error" "$OUT/$1.log" | head -3
  echo "-- $1: $(head -1 "$OUT/$1.log")"
}
# SERVE_1B=0 leaves out the 1B folder's runs (generation, loads, the server's tests).
if [[ ${SERVE_BIG:-0} != only && ${SERVE_1B:-1} == 1 ]]; then
echo "== serve: generation on the GPU, tandem generate and transformers generate on the same folder"
install_wheels clients || true
gdir="$OUT/gen-model"; mkdir -p "$gdir"
# SERVE_PRESET (e.g. llama3.2-1B: the issue's 1.24 B shape, vocabulary 128256, tied) replaces the layered folder.
if [[ -n ${SERVE_PRESET:-} ]]; then
  python3 bench/generate_peer.py make "$gdir" --preset "$SERVE_PRESET" 2>&1 | tail -1
else
  python3 bench/generate_peer.py make "$gdir" --layers "${SERVE_LAYERS:-22}" 2>&1 | tail -1
fi
write_prompts "${SERVE_BATCH:-32}" "$OUT/gen-prompts.txt"
gen=("$BUILD/tandem" generate --checkpoint "$gdir" --prompts "$OUT/gen-prompts.txt" --max-tokens 128 --ignore-eos
     --max-batch "${SERVE_BATCH:-32}" --kv-cache-gib 1)
"${gen[@]}" >"$OUT/gen-resident.log" 2>&1; tail -3 "$OUT/gen-resident.log"
"${gen[@]}" --eager >"$OUT/gen-resident-eager.log" 2>&1; tail -1 "$OUT/gen-resident-eager.log"
# SERVE_AB=1: the same, the batch-1 run and the default load also with LibTorch's ops only
# (TANDEM_DECODE_KERNELS=torch: pages gathered into copies, norms, RoPE, cache writes and the
# activation unfused), against tandem's kernels (Note [Paged decode attention], Note [Decode fusions]).
if [[ ${SERVE_AB:-0} == 1 ]]; then
  echo "-- the same with TANDEM_DECODE_KERNELS=torch"
  TANDEM_DECODE_KERNELS=torch "${gen[@]}" >"$OUT/gen-resident-torch.log" 2>&1; tail -3 "$OUT/gen-resident-torch.log"
fi

"${gen[@]}" --gpu-memory-gib 1.8 >"$OUT/gen-streamed.log" 2>&1; tail -3 "$OUT/gen-streamed.log"
python3 bench/generate_peer.py time "$gdir" --prompts "$OUT/gen-prompts.txt" --max-tokens 128 2>&1 | tail -1
python3 bench/generate_peer.py time "$gdir" --prompts "$OUT/gen-prompts.txt" --max-tokens 128 --max-gpu-gib 1.8 2>&1 | tail -1
echo "== serve: batch 1, tandem generate and transformers generate"
head -1 "$OUT/gen-prompts.txt" >"$OUT/gen-prompt1.txt"
"$BUILD/tandem" generate --checkpoint "$gdir" --prompts "$OUT/gen-prompt1.txt" --max-tokens 128 --ignore-eos \
  --max-batch 1 --kv-cache-gib 1 >"$OUT/gen-batch1.log" 2>&1; tail -3 "$OUT/gen-batch1.log"
"$BUILD/tandem" generate --checkpoint "$gdir" --prompts "$OUT/gen-prompt1.txt" --max-tokens 128 --ignore-eos \
  --max-batch 1 --kv-cache-gib 1 --eager >"$OUT/gen-batch1-eager.log" 2>&1; tail -1 "$OUT/gen-batch1-eager.log"
[[ ${SERVE_AB:-0} == 1 ]] && TANDEM_DECODE_KERNELS=torch "$BUILD/tandem" generate --checkpoint "$gdir" \
  --prompts "$OUT/gen-prompt1.txt" --max-tokens 128 --ignore-eos --max-batch 1 --kv-cache-gib 1 \
  >"$OUT/gen-batch1-torch.log" 2>&1 && echo "-- TANDEM_DECODE_KERNELS=torch:" && tail -3 "$OUT/gen-batch1-torch.log"
# The same batch-1 run with the decode kernels launched the ordinary way (Note [Dependent launch]),
# then once more with them as dependents: the A/B of dependent launches in one invocation.
if [[ ${SERVE_DEP_AB:-1} == 1 ]]; then
  for dep in off on; do
    TANDEM_DEPENDENT_LAUNCH=$dep "$BUILD/tandem" generate --checkpoint "$gdir" --prompts "$OUT/gen-prompt1.txt" \
      --max-tokens 128 --ignore-eos --max-batch 1 --kv-cache-gib 1 >"$OUT/gen-batch1-dep-$dep.log" 2>&1
    echo "-- batch 1, TANDEM_DEPENDENT_LAUNCH=$dep:"; grep -aE "^decode:|tokens/s" "$OUT/gen-batch1-dep-$dep.log" | tail -2
  done
  TANDEM_DEPENDENT_LAUNCH=off "${gen[@]}" >"$OUT/gen-resident-dep-off.log" 2>&1
  echo "-- batch ${SERVE_BATCH:-32}, TANDEM_DEPENDENT_LAUNCH=off:"; grep -aE "^decode:|tokens/s" "$OUT/gen-resident-dep-off.log" | tail -2
fi
epilogue_ab "$gdir" gen-batch1-epi
# SERVE_NCU=1: every kernel of a batch-1 generation of 3 tokens (eager) timed by Nsight Compute,
# the decode steps' kernels summed by name (ncu-decode.txt): what a decode step spends its time on.
if [[ ${SERVE_NCU:-0} == 1 ]] && command -v ncu >/dev/null; then
  ncu --clock-control none --metrics gpu__time_duration.sum --csv --log-file "$OUT/ncu.csv" \
    "$BUILD/tandem" generate --checkpoint "$gdir" --prompts "$OUT/gen-prompt1.txt" --max-tokens 3 --ignore-eos \
    --max-batch 1 --kv-cache-gib 1 --eager >"$OUT/ncu-generate.log" 2>&1
  python3 bench/ncu_kernels.py "$OUT/ncu.csv" --last-step >"$OUT/ncu-decode.txt" 2>&1; head -40 "$OUT/ncu-decode.txt"
fi
python3 bench/generate_peer.py time "$gdir" --prompts "$OUT/gen-prompt1.txt" --max-tokens 128 2>&1 | tail -1
# Every load asks for its 128 tokens whatever the random model samples (SERVE_LOAD_FLAGS, default
# --ignore-eos; "" lets requests stop at EOS).
# The load on the server's defaults (SERVE_ARGS, default none: the KV cache and the running batch
# sized from memory, Note [Generation memory]), then on SERVE_ARGS_B (default a fixed batch of 64 and
# a 2 GiB cache, the earlier benchmarks' flags; "" skips it).
echo "== serve: ${SERVE_CLIENTS:-64} clients for ${SERVE_LOAD_S:-60} s on tandem serve (bench/serve_load.py)"
serve_load_run serve-load "${SERVE_ARGS:-}"
serve_mix_run serve-mix
[[ ${SERVE_AB:-0} == 1 ]] && TANDEM_DECODE_KERNELS=torch serve_load_run serve-load-torch "${SERVE_ARGS:-}"
serve_b=${SERVE_ARGS_B---max-batch 64 --kv-cache-gib 2}
[[ -n $serve_b ]] && serve_load_run serve-load-b "$serve_b"
# The prefix cache (Note [Prefix cache]) on a chat load whose requests share a system prompt of
# SERVE_SYSTEM_WORDS words (default 220: about 300 tokens with the folder's tokenizer), with the
# cache and with --no-prefix-cache, SERVE_LOAD_S seconds each.
for cache in ${SERVE_PREFIX-on off}; do
  flag=""; [[ $cache == off ]] && flag="--no-prefix-cache"
  python3 bench/serve_load.py --checkpoint "$gdir" --cli "$BUILD/tandem" --server-log "$OUT/serve-prefix-$cache-server.log" \
    --serve-args "${SERVE_ARGS:-} $flag" --clients "${SERVE_CLIENTS:-64}" \
    --duration "${SERVE_LOAD_S:-60}" --endpoint chat --stream --max-tokens 128 ${SERVE_LOAD_FLAGS---ignore-eos} \
    --system-words "${SERVE_SYSTEM_WORDS:-220}" \
    --json "$OUT/serve-prefix-$cache.json" >"$OUT/serve-prefix-$cache.log" 2>&1 || tail -3 "$OUT/serve-prefix-$cache.log"
  echo "prefix cache $cache: $(head -1 "$OUT/serve-prefix-$cache.log")"
done
if [[ ${SERVE_PYTEST:-1} == 1 ]]; then
(cd tests/python && env PYTHONPATH="$PWD/../../$BUILD/python${PYTHONPATH:+:$PYTHONPATH}" \
  TANDEM_CLI="$PWD/../../$BUILD/tandem" python3 -m pytest -q -p no:cacheprovider test_serve.py test_serve_http.py test_serve_prefix.py) >"$OUT/pytest-serve.log" 2>&1
tail -2 "$OUT/pytest-serve.log"
fi
fi
# SERVE_7B=1: Llama-2-7B's shape with random weights (13.5 GB, in /dev/shm where it fits): tandem
# generate at batch 1 (tandem's kernels and LibTorch's ops only) and at batch SERVE_BATCH, transformers'
# generate at both, and the load of the 1B runs above on it (SERVE_LOAD_S seconds).
if [[ ${SERVE_7B:-0} == 1 ]]; then
echo "== serve: Llama-2-7B's shape, tandem generate and transformers generate, then the load"
install_wheels clients || true
s7=/tmp/gen-7b
(( $(df --output=avail -B1 /dev/shm 2>/dev/null | tail -1 || echo 0) > 20000000000 )) && s7=/dev/shm/gen-7b
mkdir -p "$s7"
python3 bench/generate_peer.py make "$s7" --preset llama2-7B 2>&1 | tail -1
[[ -f $OUT/gen-prompts.txt ]] || write_prompts "${SERVE_BATCH:-32}" "$OUT/gen-prompts.txt"
head -1 "$OUT/gen-prompts.txt" >"$OUT/gen-prompt1.txt"
g7=("$BUILD/tandem" generate --checkpoint "$s7" --max-tokens 128 --ignore-eos --kv-cache-gib 4)
"${g7[@]}" --prompts "$OUT/gen-prompt1.txt" --max-batch 1 >"$OUT/gen7-batch1.log" 2>&1; tail -2 "$OUT/gen7-batch1.log"
TANDEM_DECODE_KERNELS=torch "${g7[@]}" --prompts "$OUT/gen-prompt1.txt" --max-batch 1 >"$OUT/gen7-batch1-torch.log" 2>&1
echo "-- TANDEM_DECODE_KERNELS=torch:"; tail -2 "$OUT/gen7-batch1-torch.log"
if [[ ${SERVE_DEP_AB:-1} == 1 ]]; then
  TANDEM_DEPENDENT_LAUNCH=off "${g7[@]}" --prompts "$OUT/gen-prompt1.txt" --max-batch 1 >"$OUT/gen7-batch1-dep-off.log" 2>&1
  echo "-- TANDEM_DEPENDENT_LAUNCH=off:"; tail -2 "$OUT/gen7-batch1-dep-off.log"
fi
epilogue_ab "$s7" gen7-batch1-epi
"${g7[@]}" --prompts "$OUT/gen-prompts.txt" --max-batch "${SERVE_BATCH:-32}" >"$OUT/gen7-batch.log" 2>&1
tail -2 "$OUT/gen7-batch.log"
python3 bench/generate_peer.py time "$s7" --prompts "$OUT/gen-prompt1.txt" --max-tokens 128 2>&1 | tail -1
python3 bench/generate_peer.py time "$s7" --prompts "$OUT/gen-prompts.txt" --max-tokens 128 2>&1 | tail -1
gdir=$s7 serve_load_run serve7-load "${SERVE_ARGS:-}"
gdir=$s7 serve_mix_run serve7-mix
rm -rf "$s7"
fi
if [[ ${SERVE_BIG:-0} != 0 ]]; then
echo "== serve: 13B random weights over a 16 GiB and a 6 GiB GPU share, tandem generate and transformers + accelerate"
bigdir=${SERVE_BIG_DIR:-/tmp/gen-13b}
shm_free=$(df --output=avail -B1 /dev/shm 2>/dev/null | tail -1 || echo 0)
if [[ -z ${SERVE_BIG_DIR:-} ]] && (( shm_free > 32000000000 )); then
  bigdir=/dev/shm/gen-13b  # memory: writing and reading the folder costs no disk time
fi
rm -rf "$bigdir"; mkdir -p "$bigdir"
big_limit=(timeout -k 10 "${SERVE_BIG_TIMEOUT:-180}")
"${big_limit[@]}" python3 bench/generate_peer.py make "$bigdir" --preset 13B >"$OUT/gen-13b-make.log" 2>&1
tail -1 "$OUT/gen-13b-make.log"
write_prompts 8 "$OUT/gen-13b-prompts.txt"
for share in 16 6; do
  "${big_limit[@]}" "$BUILD/tandem" generate --checkpoint "$bigdir" --prompts "$OUT/gen-13b-prompts.txt" \
    --max-tokens 32 --ignore-eos --max-batch 8 --gpu-memory-gib "$share" --kv-cache-gib 1 \
    >"$OUT/gen-13b-tandem-$share.log" 2>&1 || tail -3 "$OUT/gen-13b-tandem-$share.log"
  grep -E "weights:|tokens/s" "$OUT/gen-13b-tandem-$share.log" | cut -c1-300
done
"${big_limit[@]}" python3 bench/generate_peer.py time "$bigdir" --prompts "$OUT/gen-13b-prompts.txt" --max-tokens 32 \
  --max-gpu-gib 16 >"$OUT/gen-13b-accelerate.log" 2>&1 || tail -3 "$OUT/gen-13b-accelerate.log"
grep -E "accelerate device map|transformers generate" "$OUT/gen-13b-accelerate.log"
rm -rf "$bigdir"
fi
fi

if has pipeline; then
# Pipeline stages on one GPU and the host (Note [Pipeline partition], Note [CPU pipeline stage]): the
# partitioner's profile and plan for PP_MODEL (default 1B) with the CPU weighed as a stage, then a run
# of PP_RUN_MODEL (default 125M) in 2 stages, the CPU first (the embedding's side) and the GPU second,
# cut by the partitioner, whose predicted step is set against the measured one in the log.
pp=(--set model.tie_embeddings=false --set train.precision=bf16 --set train.micro_batch=4 --set train.grad_accum=8)
echo "== pipeline: the partitioner on ${PP_MODEL:-1B}, T=2048, micro-batch 4, 8 micro-batches"
"$BUILD/tandem" inspect -p "${PP_MODEL:-1B}" --partition --partition-cpu "${pp[@]}" --set train.seq_len=2048 \
  >"$OUT/partition.log" 2>&1 || true
tail -25 "$OUT/partition.log" | cut -c1-200
echo "== pipeline: ${PP_RUN_MODEL:-125M} over cpu and cuda:0, T=512, the partitioner's cut"
"$BUILD/tandem" launch --nproc-per-node 2 --master-port 29611 -- "$BUILD/tandem" train -p "${PP_RUN_MODEL:-125M}" \
  "${pp[@]}" --set train.seq_len=512 --set dist.pipeline_stages=2 --set dist.pipeline_devices=cpu,cuda:0 \
  --steps "${PP_STEPS:-12}" --set train.eval_every=0 --set train.save_final=false --set train.progress=lines \
  --set train.log_every=4 --run-dir "$OUT/pp-cpu-cuda" >"$OUT/pp-cpu-cuda.log" 2>&1 || true
grep -E "stage [0-9] of|pipeline: step|error|step +[0-9]+" "$OUT/pp-cpu-cuda.log" | tail -12 | cut -c1-240
fi

if has placement; then
pl_args=()
for model in ${PL_MODELS:-amx-moe 1B}; do
  case $model in
    amx-moe) shape=(--set train.micro_batch=16 --set train.seq_len=512) mov="1,2" steps=${PL_STEPS_amx:-60} ;;
    1B) shape=(--set train.micro_batch=8 --set train.seq_len=2048) mov="24" steps=${PL_STEPS_1B:-30} ;;
    *) shape=() mov="" steps=30 ;;
  esac
  pl=(-p "$model" --set train.precision=bf16 --set offload.optimizer=cpu --set offload.host_ring=0 "${shape[@]}"
      --steps "$steps" --set train.eval_every=0 --set train.save_final=false --set train.progress=lines
      --set train.log_every=10 --set monitor.period_s=0.1 --set placement.movable="$mov")
  echo "== placement: $model, movable blocks $mov, $steps steps per run"
  run_pl() {  # name, extra settings...
    local name=$1; shift
    "$BUILD/tandem" train "${pl[@]}" "$@" --run-dir "$OUT/pl-$model-$name" >"$OUT/pl-$model-$name.log" 2>&1 \
      || tail -3 "$OUT/pl-$model-$name.log"
    grep -E "placement (at|cost)" "$OUT/pl-$model-$name.log" | head -4 | cut -c1-300
    pl_args+=("$model:$name=$OUT/pl-$model-$name")
  }
  run_pl all-gpu --set placement.policy=static --set placement.blocks=gpu
  budget=$(python3 bench/placement_table.py budget "$OUT/pl-$model-all-gpu" 2>/dev/null || echo 0)
  echo "budget: $budget W (60 % of the all-GPU average)"
  run_pl threshold --set placement.policy=threshold
  run_pl cost-budget --set placement.policy=cost --set placement.gpu_power_budget_w="$budget"
  run_pl idle-budget --set placement.policy=cost --set placement.gpu_power_budget_w="$budget" --set placement.movable=none
done
fi

if has families; then
# The decoder families (Note [Decoder families]) on the GPU: tests/python/test_families.py (each family's
# transformers folder served, generated and offload-trained on cuda, fp32 against transformers' greedy),
# then FAM_PRESETS (default "qwen2.5-0.5B gemma2-2B mistral-7B") as random-weight bf16 folders
# (bench/generate_peer.py make --preset), 32 prompts of 128 new tokens by tandem generate and by
# transformers' generate on the same folder, alternating; each folder deleted after its runs.
echo "== families: the families' tests on the GPU, then tandem generate against transformers per family"
install_wheels clients || true
(cd tests/python && env PYTHONPATH="$PWD/../../$BUILD/python${PYTHONPATH:+:$PYTHONPATH}" \
  TANDEM_CLI="$PWD/../../$BUILD/tandem" python3 -m pytest -q -p no:cacheprovider test_families.py) >"$OUT/pytest-families.log" 2>&1
grep -E "passed|failed|Error" "$OUT/pytest-families.log" | tail -12 | cut -c1-300
write_prompts 32 "$OUT/fam-prompts.txt"
for preset in ${FAM_PRESETS:-qwen2.5-0.5B gemma2-2B mistral-7B}; do
  fdir=/tmp/fam-$preset; rm -rf "$fdir"; mkdir -p "$fdir"
  python3 bench/generate_peer.py make "$fdir" --preset "$preset" 2>&1 | grep -E "wrote|Error"
  for i in 1 2; do
    "$BUILD/tandem" generate --checkpoint "$fdir" --prompts "$OUT/fam-prompts.txt" --max-tokens 128 --ignore-eos \
      --max-batch 32 --kv-cache-gib 2 >"$OUT/fam-$preset-$i.log" 2>&1 || tail -3 "$OUT/fam-$preset-$i.log"
    echo "$preset tandem: $(grep -E "tokens/s" "$OUT/fam-$preset-$i.log" | tail -1 | cut -c1-200)"
    python3 bench/generate_peer.py time "$fdir" --prompts "$OUT/fam-prompts.txt" --max-tokens 128 2>&1 | tail -1 \
      | sed "s/^/$preset /"
  done
  rm -rf "$fdir"
done
fi

echo "== summary ($(date -u +%Y-%m-%d), $(head -2 "$OUT/gpu.txt" | tail -1))"
has tests && grep -E "tests passed" "$OUT/ctest.log"
has optim && python3 bench/optim_table.py "$OUT/optim-tandem.jsonl" "$OUT/optim-peers.jsonl"
has bk && cat "$OUT/bk_core.log" && python3 bench/train_curves.py "$OUT/train-bk-125M" "$OUT/train-125M" --svg "$OUT/bk-125M-loss.svg"
has offload && python3 bench/offload_compare.py "$OUT/off125-gpu" "$OUT/off125-gpu2" "$OUT/off125-k0" "$OUT/off125-k0.5" \
  "$OUT/off125-delayed" && python3 bench/offload_compare.py "$OUT/off125-gpu-lr6" "$OUT/off125-k0-lr6" \
  && python3 bench/offload_compare.py "$OUT/off125-nd1" "$OUT/off125-nd2" \
  && { [[ ${OFF_1B:-1} != 1 ]] || python3 bench/offload_compare.py "$OUT/off1b-gpu" "$OUT/off1b-k0" "$OUT/off1b-kauto"; }
has big && python3 bench/offload_big.py "$OUT/big-bound.jsonl" "$OUT/big-exact" "$OUT/big-delayed" "$OUT/big-deepspeed.jsonl"
has curve && python3 bench/train_curves.py --every 20 --svg "$OUT/curve.svg" $(for c in ${CURVE_RUNS:-gpu exact delayed}; do echo "$OUT/curve-$c"; done)
has telemetry && python3 bench/telemetry_table.py "${tel_on[@]}" -- "${tel_off[@]}"
has train && python3 bench/compare.py --tandem "${tandem_runs[@]}" --pytorch "${pytorch_runs[@]}"
has serve && [[ ${SERVE_BIG:-0} != only ]] && python3 bench/serve_load.py --table $(ls "$OUT"/serve-load.json \
  "$OUT"/serve-load-torch.json "$OUT"/serve7-load.json "$OUT"/serve-load-b.json "$OUT"/serve-prefix-on.json "$OUT"/serve-prefix-off.json 2>/dev/null)
has serve && [[ ${SERVE_BIG:-0} != 0 ]] && python3 bench/generate_peer.py table "tandem, 16 GiB=$OUT/gen-13b-tandem-16.log" \
  "tandem, 6 GiB=$OUT/gen-13b-tandem-6.log" "transformers + accelerate, 16 GiB=$OUT/gen-13b-accelerate.log"
has placement && python3 bench/placement_table.py table "${pl_args[@]}" --json "$OUT/placement.json"
has dist && python3 bench/dist_scaling_table.py table "$OUT/dist-runs.jsonl" --json "$OUT/dist-scaling.json" \
  --gpu-txt "$OUT/gpu.txt"
exit $test_rc
