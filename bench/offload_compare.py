#!/usr/bin/env python3
"""Compares tandem runs: the reference (first) against the others, step by step.

    python3 bench/offload_compare.py REF_RUN RUN [RUN ...]

Prints, per run: median tokens/s, step time, peak GPU memory, host peak, the offload split and
rollbacks, and the loss's largest relative difference from the reference over the common steps
(how many steps differ by more than 1%, and the first that does), and the largest relative difference of 25-step means.
"""
import sys

from run_dir import read_metrics, read_summary, run_cli, run_name


def load(run):
    """Step rows by step number (the last copy of a step a resumed run repeated) and the summary."""
    steps = {r["step"]: r for r in read_metrics(run).steps}
    return steps, read_summary(run)


def main():
    runs = sys.argv[1:]
    ref_steps, _ = load(runs[0])
    print("| run | tokens/s | step ms | peak GPU GiB | peak host GiB | GPU blocks | rollbacks | max loss diff vs ref | steps > 1% | first > 1% | 25-step means, max diff |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for run in runs:
        steps, s = load(run)
        common = sorted(set(steps) & set(ref_steps))
        diffs = [abs(steps[k]["loss"] - ref_steps[k]["loss"]) / abs(ref_steps[k]["loss"]) for k in common]
        last = steps[max(steps)] if steps else {}
        windows = [common[i:i + 25] for i in range(0, len(common) - 24, 25)]
        wdiff = [abs(sum(steps[k]["loss"] for k in w) - sum(ref_steps[k]["loss"] for k in w)) /
                 sum(ref_steps[k]["loss"] for k in w) for w in windows]
        print(f"| {run_name(run)} | {s['median_tokens_per_s']:,.0f} | "
              f"{s['median_step_time_s'] * 1e3:.1f} | {s['peak_device_bytes'] / 2**30:.2f} | "
              f"{s['peak_host_bytes'] / 2**30:.2f} | {last.get('offload_gpu_blocks', '-')} | "
              f"{last.get('offload_rollbacks', '-')} | {max(diffs) * 100 if diffs else 0:.3f}% | "
              f"{sum(d > 0.01 for d in diffs)} of {len(diffs)} | "
              f"{next((k for k, d in zip(common, diffs) if d > 0.01), '-')} | {max(wdiff) * 100 if wdiff else 0:.2f}% |")


if __name__ == "__main__":
    run_cli(main)
