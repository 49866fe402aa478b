#!/usr/bin/env python3
"""The optimizer benchmark's table: tandem's CPU kernels (`tandem bench optim --json`) against the
peers (bench/optim_peers.py --json), with the ratios the targets are stated in.

Usage: optim_table.py TANDEM.jsonl PEERS.jsonl
Each file may hold several runs (lines are appended); per measurement the median over runs of the
per-run medians is used, and the run count is shown.
"""
import json
import re
import statistics
import sys
from collections import defaultdict


def load(path, key):
    rows = defaultdict(list)
    for line in open(path):
        if line.strip():
            j = json.loads(line)
            rows[(key(j), j["params"])].append(j)
    return rows


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    ours = load(sys.argv[1], lambda j: f'{j["impl"]}: {j["variant"]}')
    peers = load(sys.argv[2], lambda j: j["impl"])
    allrows = {**ours, **peers}
    best = None
    for name, _ in ours:
        m = re.match(r"tandem: AdamW bf16 grads, bf16 states \[(\w+)\]$", name)
        if m:
            best = m.group(1)

    def pps(name, n):
        runs = allrows.get((name, n))
        return statistics.median(r["params_per_s"] for r in runs) if runs else None

    sizes = sorted({n for _, n in allrows})
    print(f'{"implementation":<62} {"params":>7} {"runs":>4} {"G params/s":>10} {"GB/s":>7} {"B/par":>5}')
    for n in sizes:
        for (name, size), runs in sorted(allrows.items(), key=lambda kv: kv[0][0]):
            if size != n:
                continue
            p = statistics.median(r["params_per_s"] for r in runs)
            g = statistics.median(r["gbps"] for r in runs)
            print(f'{name:<62} {n / 2**20:>6.0f}M {len(runs):>4} {p / 1e9:>10.3f} {g:>7.1f} {runs[0]["bytes_per_param"]:>5}')
        print()

    targets = [
        (f"tandem: AdamW fp32 grads, fp32 states [{best}]", "deepspeed_cpuadam", 1.0, "fp32 states, fp32 grads vs DeepSpeed CPUAdam"),
        (f"tandem: AdamW fp32 grads, fp32 states [{best}]", "torch_fused", 1.0, "fp32 states, fp32 grads vs torch fused"),
        (f"tandem: AdamW bf16 grads, fp32 states, bf16 out [{best}]", "deepspeed_cpuadam+cast", 1.25,
         "bf16 grads + fused bf16 out vs DeepSpeed + separate cast"),
        (f"tandem: AdamW bf16 grads, fp32 states, bf16 out [{best}]", "deepspeed_cpuadam+gradcast+cast", None,
         "  same vs DeepSpeed + grad cast + cast"),
        (f"tandem: AdamW bf16 grads, bf16 states [{best}]", "deepspeed_cpuadam", 1.5, "bf16 states vs DeepSpeed CPUAdam fp32"),
        (f"tandem: AdamW fp32 grads, bf16 states [{best}]", "deepspeed_cpuadam", None, "  bf16 states, fp32 grads vs the same"),
    ]
    print(f'{"ratio (params/s, same run)":<58} {"params":>7} {"ratio":>7} {"target":>7}')
    for ours_name, peer, target, label in targets:
        for n in sizes:
            a, b = pps(ours_name, n), pps(peer, n)
            if a is None or b is None:
                continue
            r = a / b
            verdict = "" if target is None else (">= %.2f ok" % target if r >= target else "< %.2f MISSED" % target)
            print(f"{label:<58} {n / 2**20:>6.0f}M {r:>7.3f} {verdict:>7}")


if __name__ == "__main__":
    main()
