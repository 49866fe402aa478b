"""One decode step's kernels from an Nsight Compute CSV (ncu --csv --metrics gpu__time_duration.sum).

The kernels of a generation's last decode steps repeat: the step is the shortest tail of K kernels
whose names equal the K before them. Prints that step's kernels summed by name (count, total
microseconds, share), longest first, and the step's kernel count and summed time.

    python3 bench/ncu_summary.py ncu.csv
"""
import argparse
import collections
import csv
import sys


def kernels(path):
    """(name, microseconds) of every kernel, in launch order."""
    with open(path, newline="") as f:
        rows = [line for line in f if line.startswith('"')]
    out = []
    for r in csv.DictReader(rows):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "ns")
        scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}.get(unit, 1e-3)
        out.append((r["Kernel Name"], value * scale))
    return out


def last_step(ks, shortest=20):
    names = [n for n, _ in ks]
    for k in range(shortest, len(names) // 2 + 1):
        if names[-k:] == names[-2 * k:-k]:
            return ks[-k:]
    return None


def short(name, width=90):
    name = name.split("(")[0] if not name.startswith("void ") else name[5:].split("(")[0]
    return name if len(name) <= width else name[:width - 3] + "..."


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv")
    a = ap.parse_args(argv)
    ks = kernels(a.csv)
    if not ks:
        print(f"no kernel timings in {a.csv}")
        return 1
    step = last_step(ks)
    if step is None:
        print(f"{len(ks)} kernels, {sum(t for _, t in ks):.1f} us in all; no repeating decode step found")
        return 1
    total = sum(t for _, t in step)
    by = collections.defaultdict(lambda: [0, 0.0])
    for n, t in step:
        by[short(n)][0] += 1
        by[short(n)][1] += t
    print(f"one decode step: {len(step)} kernels, {total:.1f} us of kernel time (of {len(ks)} kernels profiled)")
    print("| kernel | count | us | share |")
    print("|---|---|---|---|")
    for n, (c, t) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"| {n} | {c} | {t:.1f} | {100 * t / total:.1f} % |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
