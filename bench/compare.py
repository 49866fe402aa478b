#!/usr/bin/env python3
"""Prints the side-by-side table of tandem runs and PyTorch eager runs of the same model.

Usage: compare.py --tandem RUN_DIR [RUN_DIR...] --pytorch JSON [JSON...]
Each tandem RUN_DIR holds summary.json and model_config.json; each JSON is bench/pytorch_llama.py output.
"""
import argparse
import json
import statistics

from run_dir import read_model_config, read_summary, run_cli


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tandem", nargs="+", required=True)
    ap.add_argument("--pytorch", nargs="+", required=True)
    a = ap.parse_args()
    rows = []
    for d in a.tandem:
        s = read_summary(d)
        c = read_model_config(d)
        tokens = s["tokens_per_step"]
        L, dm, T = c["num_hidden_layers"], c["hidden_size"], s["seq_len"]
        flops = 6 * s["params"] * tokens + 12 * L * dm * T * tokens
        t = s["median_step_time_s"]
        rows.append(("tandem", t, tokens / t, flops / t / 1e12, s["peak_device_bytes"], s["params"]))
    for p in a.pytorch:
        j = json.load(open(p))
        rows.append(("pytorch-eager", j["median_step_time_s"], j["tokens_per_s"], j["tflops"], j["peak_mem_bytes"],
                     j["params"]))
    print(f"{'impl':<15} {'params':>8} {'s/step':>8} {'tok/s':>10} {'TFLOP/s':>8} {'peak GiB':>9}")
    for r in rows:
        print(f"{r[0]:<15} {r[5]/1e9:>7.3f}B {r[1]:>8.4f} {r[2]:>10.0f} {r[3]:>8.1f} {r[4]/2**30:>9.2f}")
    ours = statistics.median(r[2] for r in rows if r[0] == "tandem")
    peer = statistics.median(r[2] for r in rows if r[0] == "pytorch-eager")
    print(f"tandem / pytorch-eager tokens/s (medians of runs): {ours/peer:.3f}  (target >= 0.97)")


if __name__ == "__main__":
    run_cli(main)
