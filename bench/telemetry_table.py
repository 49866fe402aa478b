#!/usr/bin/env python3
"""The sampler's cost and the energy per token, from gpu-check's telemetry part.

    python3 bench/telemetry_table.py ON_RUN [ON_RUN ...] -- OFF_RUN [OFF_RUN ...]

Per run: median tokens/s and step time (summary.json), the sampler's thread CPU share, GPU and CPU
joules per token (summary.json's telemetry), mean GPU power and utilisation over the steps
(metrics.jsonl). Last, the overhead: median step time with the sampler over without, each the
median of its runs (the runs alternate on and off).
"""
import statistics
import sys

from run_dir import read_metrics, read_summary, run_cli, run_name


def load(run):
    return read_summary(run), read_metrics(run).steps


def mean(rows, key):
    v = [r[key] for r in rows if key in r]
    return statistics.mean(v) if v else float("nan")


def main():
    args = sys.argv[1:]
    cut = args.index("--")
    on, off = args[:cut], args[cut + 1:]
    print("| run | sampler | tokens/s | step ms | sampler CPU share | GPU J/token | CPU J/token | mean GPU W | mean GPU util % |")
    print("|---|---|---|---|---|---|---|---|---|")
    steps = {"on": [], "off": []}
    for kind, runs in (("on", on), ("off", off)):
        for run in runs:
            s, rows = load(run)
            t = s.get("telemetry", {})
            steps[kind].append(s["median_step_time_s"])
            def f(k, fmt):
                return format(t[k], fmt) if k in t else "-"
            print(f"| {run_name(run)} | {kind} | {s['median_tokens_per_s']:,.0f} | "
                  f"{s['median_step_time_s'] * 1e3:.1f} | {f('sampler_cpu_fraction', '.4%')} | "
                  f"{f('energy_gpu_j_per_token', '.4f')} | {f('energy_cpu_j_per_token', '.4f')} | "
                  f"{mean(rows, 'gpu_power_w'):.0f} | {mean(rows, 'gpu_util_pct'):.0f} |")
    if steps["on"] and steps["off"]:
        a, b = statistics.median(steps["on"]), statistics.median(steps["off"])
        print(f"step time with the sampler / without: {a / b:.4f} ({(a / b - 1) * 100:+.2f}%)")


if __name__ == "__main__":
    run_cli(main)
