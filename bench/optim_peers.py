#!/usr/bin/env python3
"""Times peer CPU AdamW implementations on one flat fp32 tensor (host CPU only, no GPU involved).

Usage:
  python3 bench/optim_peers.py --params 268435456,1073741824 --repeats 5 --warmup 2 --threads 16 \
      --json OUT.jsonl

--params takes a comma list; plain integers or K/M/G/B suffixes (powers of two: 256M = 2**28,
1B = 1G = 2**30). --threads sets torch.set_num_threads and OMP_NUM_THREADS (read by the OpenMP
runtime that DeepSpeed's cpu_adam op shares with torch; set before torch is imported).

Implementations, each one JSON line appended to --json (written as soon as it finishes) and one printed line:
  torch_fused                      torch.optim.AdamW(fused=True)
  torch_foreach                    torch.optim.AdamW(foreach=True)
  deepspeed_cpuadam                DeepSpeedCPUAdam(adamw_mode=True), fp32 params/grads/states
  deepspeed_cpuadam+cast           the step, then out_bf16.copy_(p) into a preallocated bf16 tensor
  deepspeed_cpuadam+gradcast+cast  g32.copy_(g_bf16), the step, then the bf16 cast (the path a
                                   bf16-gradient offload trainer takes with DeepSpeed)
Hyper-parameters: lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1 (decoupled, AdamW).
gbps uses a byte model per parameter: 28 for plain fp32 AdamW (read p,g,m,v; write p,m,v),
34 with the bf16 cast (+4 read, +2 write), 40 with the grad cast as well (+2 read, +4 write).
Per size, DeepSpeed is also checked against torch_fused after one step on identical 1M-element
copies; max_rel_diff_vs_torch = max |p_ds - p_torch| / max(|p_torch|, 1e-3) elementwise.
If DeepSpeed cannot be imported or its op cannot be built, one line says why and only the torch
implementations run (exit status 0).

Device environment (Ubuntu 24.04 host, Python 3.12, torch 2.11, no network). DeepSpeed and its
missing dependencies come as wheels in .whl (deepspeed built with DS_BUILD_OPS=0, so cpu_adam is
JIT-compiled on first use, about a minute):
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
  python3 bench/optim_peers.py --params 256M,1B --repeats 5 --warmup 2 --threads 16 --json OUT.jsonl
The JIT build of cpu_adam is plain C++ (g++ -O3 -march=native -fopenmp, -D__AVX512__ when the CPU
has AVX-512); it needs `ninja` on PATH, g++, and the Python headers (Python.h) of the interpreter.
CUDA (CUDA_HOME, nvcc) and a GPU are NOT needed. This script sets DS_ACCELERATOR=cpu unless it is
already set, so DeepSpeed does not probe the GPU; the cpu_adam op is the same for the cuda
accelerator. The build goes to TORCH_EXTENSIONS_DIR (default ~/.cache/torch_extensions) and is
reused by later runs on the same machine.
"""
import argparse
import gc
import json
import os
import statistics
import sys
import time

from bench_util import one_line

LR, BETAS, EPS, WD = 1e-3, (0.9, 0.95), 1e-8, 0.1
CHECK_N = 1 << 20  # elements in the correctness check
BYTES = {  # byte model per parameter
    "torch_fused": 28,
    "torch_foreach": 28,
    "deepspeed_cpuadam": 28,
    "deepspeed_cpuadam+cast": 34,
    "deepspeed_cpuadam+gradcast+cast": 40,
}
SUFFIX = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "B": 1 << 30}

torch = None  # imported in main() after OMP_NUM_THREADS is set


def parse_sizes(text):
    out = []
    for tok in text.split(","):
        tok = tok.strip().upper()
        if not tok:
            continue
        mult = SUFFIX.get(tok[-1], 1)
        num = tok[:-1] if tok[-1] in SUFFIX else tok
        out.append(int(float(num) * mult))
    if not out or min(out) <= 0:
        raise argparse.ArgumentTypeError(f"bad --params {text!r}")
    return out


def load_deepspeed():
    """Returns (DeepSpeedCPUAdam class, info string) or (None, reason)."""
    try:
        import deepspeed
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        from deepspeed.ops.op_builder import CPUAdamBuilder
    except Exception as e:  # ImportError, or a missing dependency raising something else
        return None, f"deepspeed import failed: {one_line(e, 400)}"
    try:
        b = CPUAdamBuilder()
        t0 = time.perf_counter()
        b.load(verbose=False)  # JIT build (or cache hit); DeepSpeedCPUAdam reuses the loaded op
        dt = time.perf_counter() - t0
        simd = b.simd_width()
    except Exception as e:
        return None, f"deepspeed {deepspeed.__version__} cpu_adam op failed to build/load: {one_line(e, 400)}"
    return DeepSpeedCPUAdam, f"deepspeed {deepspeed.__version__}: cpu_adam op loaded in {dt:.1f} s ({simd})"


def make_torch(kind, p):
    return torch.optim.AdamW([p], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, **{kind: True})


def make_ds(cls, p):
    return cls([p], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, adamw_mode=True)


def check_vs_torch(ds_cls, seed):
    """One step on identical small copies; returns (max relative diff, max absolute diff)."""
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(CHECK_N, generator=gen)
    grad = torch.randn(CHECK_N, generator=gen) * 1e-3
    a = torch.nn.Parameter(base.clone())
    b = torch.nn.Parameter(base.clone())
    a.grad, b.grad = grad.clone(), grad.clone()
    make_ds(ds_cls, a).step()
    make_torch("fused", b).step()
    diff = (a.detach() - b.detach()).abs()
    rel = (diff / b.detach().abs().clamp_min(1e-3)).max().item()
    return rel, diff.max().item()


def run_impl(name, n, base_p, base_g, ds_cls, args):
    """Builds one implementation on fresh copies and times warmup+repeats steps."""
    p = torch.nn.Parameter(base_p.clone())
    p.grad = base_g  # read-only for every implementation here
    extra = []  # tensors to keep alive for the step closure
    if name.startswith("torch_"):
        opt = make_torch(name.split("_", 1)[1], p)
        step = opt.step
    else:
        opt = make_ds(ds_cls, p)
        if name == "deepspeed_cpuadam":
            step = opt.step
        elif name == "deepspeed_cpuadam+cast":
            out16 = torch.empty(n, dtype=torch.bfloat16)
            extra = [out16]

            def step():
                opt.step()
                out16.copy_(p.detach())
        else:  # deepspeed_cpuadam+gradcast+cast
            g16 = base_g.to(torch.bfloat16)
            g32 = torch.empty(n, dtype=torch.float32)
            out16 = torch.empty(n, dtype=torch.bfloat16)
            p.grad = g32
            extra = [g16, g32, out16]

            def step():
                g32.copy_(g16)
                opt.step()
                out16.copy_(p.detach())

    times = []
    with torch.no_grad():
        for i in range(args.warmup + args.repeats):
            t0 = time.perf_counter()
            step()
            dt = time.perf_counter() - t0
            if i >= args.warmup:
                times.append(dt)
    del opt, p, extra, step
    gc.collect()
    return times


def main():
    global torch
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", type=parse_sizes, default=parse_sizes("256M,1B"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--json", default=None, help="JSON-lines output file (appended)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch as _torch
    torch = _torch
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}, threads {torch.get_num_threads()}, "
          f"cpus {os.cpu_count()}", flush=True)

    ds_cls, ds_info = load_deepspeed()
    print(ds_info, flush=True)
    impls = ["torch_fused", "torch_foreach"]
    if ds_cls is not None:
        impls += ["deepspeed_cpuadam", "deepspeed_cpuadam+cast", "deepspeed_cpuadam+gradcast+cast"]

    out = open(args.json, "a") if args.json else None
    rows = []
    for n in args.params:
        check = None
        if ds_cls is not None:
            check = check_vs_torch(ds_cls, args.seed + n)
            print(f"[N={n}] deepspeed vs torch_fused after 1 step ({CHECK_N} elems): "
                  f"max rel diff {check[0]:.3e}, max abs diff {check[1]:.3e}", flush=True)
        gen = torch.Generator().manual_seed(args.seed)
        base_p = torch.randn(n, generator=gen)
        base_g = torch.randn(n, generator=gen).mul_(1e-3)
        for name in impls:
            times = run_impl(name, n, base_p, base_g, ds_cls, args)
            med = statistics.median(times)
            rec = {"impl": name, "params": n, "threads": args.threads, "median_s": med, "min_s": min(times),
                   "times_s": times, "params_per_s": n / med, "bytes_per_param": BYTES[name],
                   "gbps": n * BYTES[name] / med / 1e9}
            if check is not None and name.startswith("deepspeed"):
                rec["max_rel_diff_vs_torch"] = check[0]
            rows.append(rec)
            print(f"[N={n}] {name:<32} median {med:.4f} s  min {min(times):.4f} s  "
                  f"{n / med / 1e9:.3f} Gparam/s  {rec['gbps']:.1f} GB/s", flush=True)
            if out:
                out.write(json.dumps(rec) + "\n")
                out.flush()
        del base_p, base_g
        gc.collect()
    if out:
        out.close()

    print(f"\n{'impl':<32} {'params':>11} {'median s':>9} {'min s':>9} {'Gparam/s':>9} {'B/param':>7} {'GB/s':>7}")
    for r in rows:
        print(f"{r['impl']:<32} {r['params']:>11} {r['median_s']:>9.4f} {r['min_s']:>9.4f} "
              f"{r['params_per_s'] / 1e9:>9.3f} {r['bytes_per_param']:>7} {r['gbps']:>7.1f}")


if __name__ == "__main__":
    main()
