#!/usr/bin/env python3
"""The big-model offload table: the forward+backward bound, the offload engine (exact and
delayed) and DeepSpeed ZeRO-2 offload, from one gpu-check run.

    python3 bench/offload_big.py BOUND.jsonl EXACT_RUN DELAYED_RUN DEEPSPEED.jsonl

Engine figures are medians over the steps after the update split's first solve (step 5 on), so
start-up and the solver's measuring steps are left out, and before the first traced step (a traced
step starts and ends with every update done, which slows it and the step after it). "GPU busy" is the bound's step time over
the engine's: the share of a step the GPU spends on forward and backward; the rest is idle or
waiting on uploads (the trace shows which).
"""
import json
import os
import statistics
import sys

from run_dir import RunDirError, read_metrics, read_trace_steps, run_cli


def last_json(path):
    if not os.path.exists(path):
        return None
    rows = [json.loads(l) for l in open(path) if l.strip()]
    return rows[-1] if rows else None


def engine(run):
    try:
        rows = read_metrics(run).steps
    except RunDirError:
        return None
    traced = read_trace_steps(run)
    end = min(traced) if traced else float("inf")
    late = [r for r in rows if 5 <= r["step"] < end] or rows
    if not late:
        return None
    step = statistics.median(r["step_time_s"] for r in late)
    return {
        "step_s": step,
        "tok_s": statistics.median(r["tokens_per_s"] for r in late),
        "k": late[-1].get("offload_k", float("nan")),
        "alpha": late[-1].get("offload_alpha", float("nan")),
        "pred_s": late[-1].get("offload_predicted_step_s", float("nan")),
        "peak_gpu": max(r.get("mem_device_peak_bytes", 0) for r in rows),
        "peak_host": max(r.get("mem_host_peak_bytes", 0) for r in rows),
        "loss": late[-1]["loss"],
        "loss0": rows[0]["loss"],
    }


def main():
    bound_path, exact, delayed, ds_path = sys.argv[1:5]
    bound = last_json(bound_path)
    ds = last_json(ds_path)
    runs = {"tandem exact": engine(exact), "tandem delayed update": engine(delayed)}
    print("| run | step s | tokens/s | model TFLOP/s | vs bound | GPU busy | k | alpha | predicted s | peak GPU GiB | peak host GiB | loss first -> last |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    if bound:
        n = bound["params"]
        print(f"| forward+backward bound | {bound['median_step_s']:.3f} | {bound['tokens_per_s']:,.0f} | "
              f"{bound['model_tflops']:.0f} | 1.00x | 100% | - | - | - | {bound['peak_device_bytes'] / 2**30:.1f} | - | - |")
    else:
        n = None
        print("| forward+backward bound | (missing) |")
    for name, r in runs.items():
        if r is None:
            print(f"| {name} | (failed: see its log) |")
            continue
        tfl = f"{6 * n * r['tok_s'] / 1e12:.0f}" if n else "-"
        vs = f"{r['step_s'] / bound['median_step_s']:.2f}x" if bound else "-"
        busy = f"{100 * bound['median_step_s'] / r['step_s']:.0f}%" if bound else "-"
        print(f"| {name} | {r['step_s']:.3f} | {r['tok_s']:,.0f} | {tfl} | {vs} | {busy} | {r['k']:.2f} | "
              f"{r['alpha']:.3f} | {r['pred_s']:.3f} | {r['peak_gpu'] / 2**30:.1f} | {r['peak_host'] / 2**30:.1f} | "
              f"{r['loss0']:.3f} -> {r['loss']:.3f} |")
    if ds and "error" not in ds:
        print(f"| DeepSpeed ZeRO-{ds.get('stage', 2)} offload (ratio {ds.get('ratio', 1)}) | {ds['median_step_s']:.3f} | "
              f"{ds['tokens_per_s']:,.0f} | {ds['model_tflops']:.0f} | "
              f"{ds['median_step_s'] / bound['median_step_s'] if bound else float('nan'):.2f}x | - | - | - | - | "
              f"{ds['peak_gpu_bytes'] / 2**30:.1f} | {ds['peak_host_bytes'] / 2**30:.1f} | - |")
        for name, r in runs.items():
            if r:
                print(f"{name}: {r['tok_s'] / ds['tokens_per_s']:.2f}x DeepSpeed's tokens/s")
    else:
        print(f"| DeepSpeed ZeRO-2 offload | failed: {ds.get('error') if ds else 'no result (see big-deepspeed.log)'} |")


if __name__ == "__main__":
    run_cli(main)
