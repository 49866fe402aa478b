#!/usr/bin/env bash
# On the GPU machine: build against its PyTorch's LibTorch, run the test suite (GPU tests
# included), then the benchmarks, each against its peer in the same run:
#   optim  the CPU optimizer kernels (`tandem bench optim`) against torch's CPU AdamW and DeepSpeed
#          CPUAdam (bench/optim_peers.py; DeepSpeed from the wheels in .whl when present),
#          256M and 1B parameters, alternating;
#   train  tandem and PyTorch eager on the identical 1B model (bf16, B=8, T=2048), alternating;
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
#          step`), the engine exact and delayed, DeepSpeed ZeRO-2 offload (bench/deepspeed_offload.py).
# OFF_1B=0 leaves out the 1B offload runs. PARTS selects (default "tests optim train bk offload"; add big); CTEST_ARGS (e.g. "-R BkCore") narrows the tests. Prints short tables last. Logs and JSON go to $OUT
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
export PYTHONUNBUFFERED=1

prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
# Debian packages the image lacks (cpp-httplib, Chart.js), carried as .debs and unpacked aside.
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
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit --format=csv | tee "$OUT/gpu.txt"
echo "== build"
t0=$(date +%s)
cmake -G Ninja -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_CUDA_ARCHITECTURES=90 "${cmake_extra[@]}" >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
grep -E "^-- tandem:" "$OUT/cmake.log"
ninja -C "$BUILD" >"$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"

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
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
lscpu | grep -E "Model name|^CPU\(s\)|Thread|Core|MHz" | tee "$OUT/cpu.txt"
rm -f "$OUT/optim-tandem.jsonl" "$OUT/optim-peers.jsonl"
for i in 1 2; do
  "$BUILD/tandem" bench optim --params 256M,1B --repeats 7 --warmup 2 --isa avx2,avx512,scalar \
    --json "$OUT/optim-tandem.jsonl" >"$OUT/optim-tandem-$i.log" 2>&1 || tail -5 "$OUT/optim-tandem-$i.log"
  python3 bench/optim_peers.py --params 256M,1B --repeats 7 --warmup 2 --threads "$(nproc)" \
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
corpus="$OUT/corpus.txt"
[[ -s "$corpus" ]] || find /usr/lib/python3* -name '*.py' -size +4k 2>/dev/null | sort | head -4000 | xargs cat 2>/dev/null | head -c 60000000 >"$corpus"
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
# engine exact (no speculation: the undo log does not fit the host) and delayed, and DeepSpeed
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
for mode in exact delayed; do
  big_has $mode || continue
  extra=(--set offload.speculate=never "${bigset[@]}")
  [[ $mode == delayed ]] && extra+=(--set offload.delayed_update=true)
  echo "== $BIG: offload engine, $mode, $BIG_STEPS steps"
  "$BUILD/tandem" train "${bigargs[@]}" --set train.eval_every=0 --set train.save_final=false --set train.progress=lines \
    --steps "$BIG_STEPS" --set train.log_every=1 --set offload.optimizer=cpu --set offload.trace_steps=$((BIG_STEPS - 1)) \
    "${extra[@]}" --run-dir "$OUT/big-$mode" >"$OUT/big-$mode.log" 2>&1 || tail -8 "$OUT/big-$mode.log"
  grep -E "offload:|update split|done|error" "$OUT/big-$mode.log"
done
if big_has deepspeed && compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
  echo "== $BIG: DeepSpeed ZeRO-2, offload_optimizer=cpu"
  rm -f "$OUT/big-deepspeed.jsonl"
  python3 bench/deepspeed_offload.py --model-config "$OUT/big-bound.json" --batch "${BIG_BATCH:-8}" --seq 2048 \
    --steps 8 --warmup 3 --checkpointing --json "$OUT/big-deepspeed.jsonl" >"$OUT/big-deepspeed.log" 2>&1
  tail -2 "$OUT/big-deepspeed.log"
fi
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
python3 - "$live" <<'PY'
import glob, json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
run = sys.argv[1]
ea = EventAccumulator(run + "/tensorboard"); ea.Reload()
tags = ea.Tags()["scalars"]
loss = ea.Scalars("train/loss")
print(f"tensorboard reader: {len(tags)} scalar tags, train/loss {len(loss)} points, last {loss[-1].value:.4f}")
t = json.load(open(run + "/trace.json"))["traceEvents"]
ph = {}
for e in t: ph[e["ph"]] = ph.get(e["ph"], 0) + 1
print("trace events by ph:", ph, "| counter tracks:", sorted({e["name"] for e in t if e["ph"] == "C"}))
s = json.load(open(sys.argv[1] + "/../live-series.json"))
print(f"captured mid-run: {len(s['rows'])} rows, {len(s['samples'])} samples, done={s['done']}")
PY
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
  python3 - "$OUT/ckpt-$mode" "$mode" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
steps = {r["step"]: r["step_time_s"] for r in rows if "loss" in r}
ck = [r for r in rows if "checkpoint_blocking_s" in r or "checkpoint_write_s" in r]
base = statistics.median(steps[s] for s in range(5, 21))
after = statistics.median(steps[s] for s in range(21, 41))
print(f"async={sys.argv[2]}: median step 5-20 {base*1e3:.1f} ms, 21-40 {after*1e3:.1f} ms (x{after/base:.3f}), "
      f"step 21 {steps[21]*1e3:.1f} ms | " + "; ".join(
      ", ".join(f"{k} {v:.2f}" for k, v in r.items() if k.startswith("checkpoint_") and isinstance(v, float)) for r in ck))
PY
  du -sh "$OUT/ckpt-$mode/checkpoints" | cut -f1; rm -rf "$OUT/ckpt-$mode/checkpoints"
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
has telemetry && python3 bench/telemetry_table.py "${tel_on[@]}" -- "${tel_off[@]}"
has train && python3 bench/compare.py --tandem "${tandem_runs[@]}" --pytorch "${pytorch_runs[@]}"
exit $test_rc
