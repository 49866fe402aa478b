#!/usr/bin/env python3
"""A checkpoint's cost in step time, from gpu-check's resilience part: a 40-step run with a
checkpoint at step 20, written in the background (async true) or in place (false).

    python3 bench/checkpoint_cost.py RUN_DIR ASYNC

Prints one line: the median step time of steps 5-20 and of 21-40, their ratio, step 21's time, and
per checkpoint row the seconds it reports (checkpoint_blocking_s: the step loop's wait;
checkpoint_write_s: the background write).
"""
import statistics
import sys

from run_dir import read_metrics, run_cli


def checkpoint_seconds(row):
    """The row's checkpoint_* durations, e.g. "checkpoint_blocking_s 0.31"."""
    return ", ".join(f"{k} {v:.2f}" for k, v in row.items() if k.startswith("checkpoint_") and isinstance(v, float))


def main():
    run, mode = sys.argv[1:3]
    metrics = read_metrics(run)
    steps = {r["step"]: r["step_time_s"] for r in metrics.steps}
    base = statistics.median(steps[s] for s in range(5, 21))
    after = statistics.median(steps[s] for s in range(21, 41))
    print(f"async={mode}: median step 5-20 {base*1e3:.1f} ms, 21-40 {after*1e3:.1f} ms (x{after/base:.3f}), "
          f"step 21 {steps[21]*1e3:.1f} ms | " + "; ".join(checkpoint_seconds(r) for r in metrics.checkpoints))


if __name__ == "__main__":
    run_cli(main)
