#!/usr/bin/env python3
"""The multi-GPU weak-scaling table of gpu-check's "dist" part: tandem and its peer at 1, 2, 4 GPUs.

    dist_scaling_table.py record MANIFEST --name N --workload W --label L --impl I --gpus N --rc RC
                                 --wall-s S --result PATH --log PATH --warmup W [--json OUT] -- COMMAND...
    dist_scaling_table.py table MANIFEST [MANIFEST...] [--json OUT] [--gpu-txt GPU_TXT] [--quiet]

`record` appends one run (its command, exit status, wall time and where its result and log lie,
relative to MANIFEST's folder) to MANIFEST (JSON lines), prints one line about it, exits 3 when the
run failed, and rewrites --json. `table` prints the table and writes --json: every number, the
machine (nvidia-smi), the date and the commands. Several manifests (the output folders of several
calls, e.g. one GPU count or one side per call) make one table; a later run of the same
implementation, workload and GPU count replaces an earlier one.

A run's result is read by its kind:
  * a directory: a tandem run directory (metrics.jsonl written by rank 0, summary.json);
  * *.jsonl: bench/deepspeed_offload.py output, its last line;
  * *.json: bench/pytorch_llama.py output.
All tokens/s are global (every rank's tokens). Each side's figure is the median step time over the
steps after the first --warmup (the same count for tandem and its peer; the peers drop them
themselves, tandem's rows are dropped here by step number), so tokens/s = tokens per step / median.
A run is failed when it exited non-zero (a time limit included) or left no timed steps; its numbers,
if any, stay in the JSON but not in the table. Scaling efficiency at n GPUs = tokens/s(n) /
(n x tokens/s(1)), of the same implementation.
"""
import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys

from run_dir import RunDirError, has_summary, read_metrics, read_summary, run_cli

WORKLOAD_ORDER = ["1b-resident", "big-offload", "pipeline-1b", "big-pp-offload", "largest"]


def tandem_result(run_dir, warmup):
    """Median over the steps after `warmup` of rank 0's metrics.jsonl (tokens/s global)."""
    try:
        rows = read_metrics(run_dir).steps  # a line cut short by a kill is left out
        timed = [r for r in rows if r["step"] > warmup]
        if not timed:
            return {"error": f"{len(rows)} steps logged, none after the first {warmup}"}
        summary = read_summary(run_dir) if has_summary(run_dir) else {}
    except RunDirError as e:
        return {"error": e.reason}
    tokens = summary.get("tokens_per_step") or timed[-1].get("tokens") or \
        round(timed[-1]["tokens_per_s"] * timed[-1]["step_time_s"])
    med = statistics.median(r["step_time_s"] for r in timed)
    return {
        "tokens_per_s": tokens / med,
        "median_step_s": med,
        "tokens_per_step": tokens,
        "steps_timed": len(timed),
        "steps_logged": len(rows),
        "summary_median_tokens_per_s": summary.get("median_tokens_per_s"),
        "peak_gpu_bytes_rank0": summary.get("peak_device_bytes") or max(
            (r.get("mem_device_peak_bytes", 0) for r in rows), default=0) or None,
        "peak_host_bytes_rank0": summary.get("peak_host_bytes") or max(
            (r.get("mem_host_peak_bytes", 0) for r in rows), default=0) or None,
        "params": summary.get("params"),
        "loss_first": rows[0]["loss"],
        "loss_last": rows[-1]["loss"],
    }


def peer_result(path):
    """bench/pytorch_llama.py's JSON or bench/deepspeed_offload.py's last JSON line."""
    if not os.path.exists(path):
        return {"error": "no result file"}
    try:
        if path.endswith(".jsonl"):
            lines = [l for l in open(path) if l.strip()]
            if not lines:
                return {"error": "empty result file"}
            j = json.loads(lines[-1])
        else:
            j = json.load(open(path))
    except ValueError as e:
        return {"error": f"unreadable result: {e}"}
    if "error" in j:
        return {"error": j["error"]}
    if "tokens_per_s" not in j:
        return {"error": "no tokens_per_s in the result"}
    med = j.get("median_step_time_s", j.get("median_step_s"))
    return {
        "tokens_per_s": j["tokens_per_s"],
        "median_step_s": med,
        "world_size": j.get("world_size", 1),
        "peak_gpu_bytes_rank0": j.get("peak_mem_bytes", j.get("peak_gpu_bytes")),
        "peak_gpu_bytes_max_rank": j.get("peak_gpu_bytes_max_rank"),
        "peak_host_bytes_rank0": j.get("peak_host_bytes"),
        "peak_host_bytes_all_ranks": j.get("peak_host_bytes_all_ranks"),
        "params": j.get("params"),
        "torch": j.get("torch"),
        "deepspeed": j.get("deepspeed_version"),
        "omp_num_threads": j.get("omp_num_threads"),
    }


def evaluate(run, base):
    """The run's parsed result and its status: ok, or failed with a short reason."""
    result = os.path.join(base, run["result"])
    res = tandem_result(result, run["warmup"]) if os.path.isdir(result) else peer_result(result)
    if run["rc"] != 0:
        why = "time limit" if run["rc"] in (124, 137) else f"exit {run['rc']}"
        res["status"] = "failed"
        res["reason"] = why + (f": {res['error']}" if "error" in res else "")
    elif "error" in res:
        res["status"] = "failed"
        res["reason"] = res["error"]
    else:
        res["status"] = "ok"
    return res


def machine(gpu_txt):
    m = {"host": platform.node(), "cpus": os.cpu_count()}
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                m["host_memory_gib"] = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version,power.limit",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30).stdout
        gpus = [l.strip() for l in out.splitlines() if l.strip()]
    except (OSError, subprocess.SubprocessError):
        gpus = []
    if not gpus and gpu_txt and os.path.exists(gpu_txt):
        gpus = [l.strip() for l in open(gpu_txt).read().splitlines()[1:] if l.strip()]
    m["gpus"] = gpus
    m["gpu_count"] = len(gpus)
    names = sorted({g.split(",")[0] for g in gpus})
    m["name"] = f"{len(gpus)}x " + " + ".join(names) if gpus else "unknown (no nvidia-smi)"
    return m


def build(runs, gpu_txt):
    """Pairs each workload's tandem and peer runs by GPU count (runs: (manifest folder, run) pairs)."""
    for base, r in runs:
        r["parsed"] = evaluate(r, base)
    runs = [r for _, r in runs]
    out = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "machine": machine(gpu_txt), "workloads": [], "runs": runs}
    # A workload is its kind and its label (the label names the preset and batch, so runs of other
    # settings joined from another call stay apart).
    keys = sorted({(r["workload"], r.get("label", r["workload"])) for r in runs},
                  key=lambda k: (WORKLOAD_ORDER.index(k[0]) if k[0] in WORKLOAD_ORDER else 99, k))
    for w, label in keys:
        mine = [r for r in runs if (r["workload"], r.get("label", r["workload"])) == (w, label)]
        sides = {}
        for r in mine:  # the last run of an (impl, n) counts
            sides[(r["impl"] == "tandem", r["gpus"])] = r
        peer_impls = sorted({r["impl"] for r in mine if r["impl"] != "tandem"})

        def tok(is_tandem, n):
            r = sides.get((is_tandem, n))
            return r["parsed"]["tokens_per_s"] if r and r["parsed"]["status"] == "ok" else None

        points = []
        for n in sorted({r["gpus"] for r in mine}):
            t, p = tok(True, n), tok(False, n)
            t1, p1 = tok(True, 1), tok(False, 1)
            points.append({
                "gpus": n,
                "tandem_tokens_per_s": t,
                "peer_tokens_per_s": p,
                "tandem_over_peer": t / p if t and p else None,
                "tandem_scaling_efficiency": t / (n * t1) if t and t1 else None,
                "peer_scaling_efficiency": p / (n * p1) if p and p1 else None,
                "tandem_run": sides.get((True, n), {}).get("name"),
                "peer_run": sides.get((False, n), {}).get("name"),
            })
        out["workloads"].append({"workload": w, "label": label, "peer": ", ".join(peer_impls) or "-",
                                 "warmup_steps_dropped": mine[0]["warmup"], "points": points})
    return out


def fmt_tok(v):
    return f"{v:,.0f}" if v else "-"


def fmt_x(v, pct=False):
    if v is None:
        return "-"
    return f"{100 * v:.0f}%" if pct else f"{v:.3f}"


def print_table(data):
    runs = {r["name"]: r for r in data["runs"]}
    print(f"dist weak scaling: {data['machine']['name']}, {data['date']}; tokens/s global, micro-batch per GPU fixed")
    print("| workload | GPUs | tandem tok/s | peer | peer tok/s | tandem / peer | tandem scaling eff. | peer scaling eff. |")
    print("|---|---|---|---|---|---|---|---|")
    failures = []
    for w in data["workloads"]:
        for p in w["points"]:
            cells = []
            for key, name in (("tandem_tokens_per_s", p["tandem_run"]), ("peer_tokens_per_s", p["peer_run"])):
                if name is None:
                    cells.append("not run")
                elif p[key] is None:
                    cells.append("failed")
                    failures.append(runs[name])
                else:
                    cells.append(fmt_tok(p[key]))
            print(f"| {w['label']} | {p['gpus']} | {cells[0]} | {w['peer']} | {cells[1]} | "
                  f"{fmt_x(p['tandem_over_peer'])} | {fmt_x(p['tandem_scaling_efficiency'], True)} | "
                  f"{fmt_x(p['peer_scaling_efficiency'], True)} |")
    for r in failures:
        print(f"failed: {r['name']} ({r['parsed']['reason'][:200]}); log {os.path.basename(r['log'])}")


def read_manifests(paths):
    """(folder, run) for every run recorded in the manifests, in order."""
    runs = []
    for path in paths:
        if os.path.exists(path):
            base = os.path.dirname(os.path.abspath(path))
            runs += [(base, json.loads(l)) for l in open(path) if l.strip()]
    return runs


def write_json(data, path):
    if path:
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=2)
        os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="append one run to the manifest")
    rec.add_argument("manifest")
    for k in ("--name", "--workload", "--label", "--impl", "--result", "--log"):
        rec.add_argument(k, required=True)
    rec.add_argument("--gpus", type=int, required=True)
    rec.add_argument("--rc", type=int, required=True)
    rec.add_argument("--wall-s", type=float, required=True)
    rec.add_argument("--warmup", type=int, required=True)
    rec.add_argument("--json", default="")
    rec.add_argument("--gpu-txt", default="")
    tab = sub.add_parser("table", help="print the table and write the JSON")
    tab.add_argument("manifest", nargs="+")
    tab.add_argument("--json", default="")
    tab.add_argument("--gpu-txt", default="")
    tab.add_argument("--quiet", action="store_true")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    a = ap.parse_args(argv[:cut])
    command = argv[cut + 1:]  # record: the run's command line, after --

    if a.cmd == "record":
        base = os.path.dirname(os.path.abspath(a.manifest))
        run = {"name": a.name, "workload": a.workload, "label": a.label, "impl": a.impl, "gpus": a.gpus,
               "rc": a.rc, "wall_s": round(a.wall_s, 1), "result": os.path.relpath(a.result, base),
               "log": os.path.relpath(a.log, base), "warmup": a.warmup,
               "command": command, "command_line": shlex.join(command), "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "NCCL_NVLS_ENABLE")}}
        with open(a.manifest, "a") as f:
            f.write(json.dumps(run) + "\n")
        res = evaluate(run, base)
        if res["status"] == "ok":
            print(f"{a.name}: {res['tokens_per_s']:,.0f} tok/s on {a.gpus} GPU(s), {res['median_step_s']:.3f} s/step "
                  f"({a.wall_s:.0f} s wall)")
        else:
            print(f"{a.name}: FAILED ({res['reason'][:300]}; {a.wall_s:.0f} s wall)")
        if a.json:
            write_json(build(read_manifests([a.manifest]), a.gpu_txt), a.json)
        return 0 if res["status"] == "ok" else 3  # the caller shows the log's end

    runs = read_manifests(a.manifest)
    if not runs:
        print(f"dist: no runs recorded in {' '.join(a.manifest)}")
        return 1
    data = build(runs, a.gpu_txt)
    write_json(data, a.json)
    if not a.quiet:
        print_table(data)
    return 0


if __name__ == "__main__":
    run_cli(main)
