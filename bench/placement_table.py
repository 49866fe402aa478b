"""Placement benchmark table: tokens/s, GPU power and joules per token of placement runs.

    python3 bench/placement_table.py budget RUN_DIR            # prints 0.6 x the run's GPU power (W)
    python3 bench/placement_table.py table LABEL=RUN_DIR ... [--json OUT]

Each figure is over the last half of the run's steps (after warm-up, the cost model's profiles and
its closed loop settling): tokens / summed step time, GPU joules / summed step time, joules / token.
"""
import json
import sys

from run_dir import has_summary, read_metrics, read_summary, run_cli


def rows(run):
    """The last half of the run's step rows."""
    out = read_metrics(run).steps
    return out[len(out) // 2:]


def figures(run):
    rs = rows(run)
    t = sum(r["step_time_s"] for r in rs)
    tok = sum(r["tokens_per_s"] * r["step_time_s"] for r in rs)
    gj = [r["energy_gpu_j"] for r in rs if "energy_gpu_j" in r]
    cj = [r["energy_cpu_j"] for r in rs if "energy_cpu_j" in r]
    f = {"steps": len(rs), "tokens_per_s": tok / t if t else 0.0}
    if len(gj) == len(rs) and t:
        f["gpu_power_w"] = sum(gj) / t
        f["gpu_j_per_token"] = sum(gj) / tok
    if len(cj) == len(rs) and tok:
        f["cpu_j_per_token"] = sum(cj) / tok
    last = rs[-1] if rs else {}
    f["placement"] = last.get("placement", "")
    f["pace_s"] = last.get("placement_pace_s", 0.0)
    f["loss"] = last.get("loss")
    if has_summary(run):
        f["summary"] = read_summary(run).get("placement", {})
    return f


def main():
    if sys.argv[1] == "budget":
        print(f"{0.6 * figures(sys.argv[2])['gpu_power_w']:.1f}")
        return
    args = sys.argv[2:]
    out_json = None
    if "--json" in args:
        i = args.index("--json")
        out_json = args[i + 1]
        del args[i:i + 2]
    table = []
    print("| model | policy | tokens/s | GPU W (avg) | GPU J/token | CPU J/token | placement | pacing s |")
    print("|---|---|---|---|---|---|---|---|")
    for arg in args:
        label, run = arg.split("=", 1)
        try:
            f = figures(run)
        except (OSError, ValueError, KeyError, ZeroDivisionError) as e:
            print(f"| {label} | failed: {e} |")
            continue
        table.append({"label": label, **{k: v for k, v in f.items()}})
        model, policy = label.split(":", 1) if ":" in label else (label, "")
        g = lambda k, fmt: (fmt % f[k]) if k in f and f[k] is not None else "n/a"
        print(f"| {model} | {policy} | {f['tokens_per_s']:.0f} | {g('gpu_power_w', '%.0f')} | "
              f"{g('gpu_j_per_token', '%.4g')} | {g('cpu_j_per_token', '%.4g')} | {f['placement']} | {f['pace_s']:.3f} |")
    if out_json:
        with open(out_json, "w") as o:
            json.dump(table, o, indent=1)


if __name__ == "__main__":
    run_cli(main)
