#!/usr/bin/env python3
"""Reads back what gpu-check's live run (telemetry part) left: the TensorBoard event file through
TensorBoard's own reader, the trace's events by phase and its counter tracks, and the dashboard data
captured while the run trained (live-series.json beside the run directory).

    python3 bench/live_run_outputs.py RUN_DIR
"""
import json
import os
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from run_dir import read_trace_events, run_cli


def main():
    run = sys.argv[1]
    ea = EventAccumulator(os.path.join(run, "tensorboard"))
    ea.Reload()
    tags = ea.Tags()["scalars"]
    loss = ea.Scalars("train/loss")
    print(f"tensorboard reader: {len(tags)} scalar tags, train/loss {len(loss)} points, last {loss[-1].value:.4f}")
    events = read_trace_events(run)
    ph = {}
    for e in events:
        ph[e["ph"]] = ph.get(e["ph"], 0) + 1
    print("trace events by ph:", ph, "| counter tracks:", sorted({e["name"] for e in events if e["ph"] == "C"}))
    with open(os.path.join(run, "..", "live-series.json")) as f:
        s = json.load(f)
    print(f"captured mid-run: {len(s['rows'])} rows, {len(s['samples'])} samples, done={s['done']}")


if __name__ == "__main__":
    run_cli(main)
