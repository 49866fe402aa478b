"""Where a program's GPU time goes, by kernel: reads the CSV of
`ncu --csv --metrics gpu__time_duration.sum ...` and prints the kernels by total time (count, total,
mean, share), the longest first; used on `tandem generate` to see what a decode step spends.

  ncu --clock-control none --csv --metrics gpu__time_duration.sum -c 6000 build/tandem generate ... >ncu.csv
  python3 bench/ncu_kernels.py ncu.csv [--top 25] [--last-step]

--last-step: only the last decode step. A generation's last steps launch the same kernels, so the
step is the shortest tail of K kernels (K >= 20) whose names equal the K before them.
"""

import argparse
import collections
import csv
import io
import sys

UNITS = {"nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0}


def kernels(path):
    """(name, seconds) of every kernel, in launch order."""
    text = open(path, errors="replace").read()
    start = text.find('"ID"')  # ncu prints its own lines before the table
    if start < 0:
        raise SystemExit(f"{path}: no ncu CSV table in it")
    out = []
    for row in csv.DictReader(io.StringIO(text[start:])):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(row["Metric Value"].replace(",", "")) * UNITS.get(row["Metric Unit"], 1e-9)
        out.append((row["Kernel Name"][:110], value))
    return out


def last_step(ks, shortest=20):
    names = [n for n, _ in ks]
    for k in range(shortest, len(names) // 2 + 1):
        if names[-k:] == names[-2 * k:-k]:
            return ks[-k:]
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--last-step", action="store_true", help="only the last of the repeating decode steps")
    args = ap.parse_args()
    ks = kernels(args.csv)
    if args.last_step:
        step = last_step(ks)
        if step is None:
            print(f"{len(ks)} kernels; no repeating decode step found")
            return 1
        print(f"one decode step of the {len(ks)} kernels profiled:")
        ks = step
    total, count = collections.Counter(), collections.Counter()
    for name, s in ks:
        total[name] += s
        count[name] += 1
    all_s = sum(total.values())
    print(f"{sum(count.values())} kernels, {all_s * 1e3:.2f} ms of GPU time")
    print("| kernel | launches | total ms | mean us | share |")
    print("|---|---|---|---|---|")
    for name, s in total.most_common(args.top):
        print(f"| `{name}` | {count[name]} | {s * 1e3:.2f} | {s / count[name] * 1e6:.1f} | {s / all_s:.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
