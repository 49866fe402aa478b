"""Where a program's GPU time goes, by kernel: reads the CSV of
`ncu --csv --metrics gpu__time_duration.sum ...` and prints the kernels by total time (count, total,
mean, share), the longest first; used on `tandem generate` to see what a decode step spends.

  ncu --clock-control none --csv --metrics gpu__time_duration.sum -c 6000 build/tandem generate ... >ncu.csv
  python3 bench/ncu_kernels.py ncu.csv [--top 25]
"""

import argparse
import collections
import csv
import io

UNITS = {"nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    text = open(args.csv, errors="replace").read()
    start = text.find('"ID"')  # ncu prints its own lines before the table
    if start < 0:
        raise SystemExit(f"{args.csv}: no ncu CSV table in it")
    total, count = collections.Counter(), collections.Counter()
    for row in csv.DictReader(io.StringIO(text[start:])):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(row["Metric Value"].replace(",", "")) * UNITS.get(row["Metric Unit"], 1e-9)
        name = row["Kernel Name"][:110]
        total[name] += value
        count[name] += 1
    all_s = sum(total.values())
    print(f"{sum(count.values())} kernels, {all_s * 1e3:.2f} ms of GPU time")
    print("| kernel | launches | total ms | mean us | share |")
    print("|---|---|---|---|---|")
    for name, s in total.most_common(args.top):
        print(f"| `{name}` | {count[name]} | {s * 1e3:.2f} | {s / count[name] * 1e6:.1f} | {s / all_s:.1%} |")


if __name__ == "__main__":
    main()
