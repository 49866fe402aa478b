#!/usr/bin/env python3
"""Loss curves of tandem run directories side by side: a table of the loss (mean over each
window of steps), median tokens/s and peak device memory, and optionally an SVG plot.

    python3 bench/train_curves.py RUN_DIR [RUN_DIR ...] [--every 25] [--last 50] [--svg curves.svg]
"""
import argparse

from run_dir import read_metrics, read_summary, run_cli, run_name


def load(run):
    return read_metrics(run).steps, read_summary(run)


def windows(steps, every):
    out, acc = [], []
    for r in steps:
        acc.append(r["loss"])
        if r["step"] % every == 0:
            out.append((r["step"], sum(acc) / len(acc)))
            acc = []
    return out


def svg(curves, path, width=640, height=320, pad=48):
    xs = [s for _, c in curves for s, _ in c]
    ys = [l for _, c in curves for _, l in c]
    x0, x1, y0, y1 = 0, max(xs), min(ys), max(ys)
    sx = lambda x: pad + (width - 2 * pad) * (x - x0) / max(x1 - x0, 1)
    sy = lambda y: height - pad - (height - 2 * pad) * (y - y0) / max(y1 - y0, 1e-9)
    colors = ["#c0392b", "#2471a3", "#229954", "#7d3c98"]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
             f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" stroke="black"/>',
             f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="black"/>',
             f'<text x="{width / 2}" y="{height - 12}" text-anchor="middle">step</text>',
             f'<text x="14" y="{height / 2}" transform="rotate(-90 14 {height / 2})" text-anchor="middle">training loss</text>']
    for k in range(5):
        y = y0 + (y1 - y0) * k / 4
        parts.append(f'<text x="{pad - 6}" y="{sy(y) + 4:.1f}" text-anchor="end">{y:.2f}</text>')
        x = x0 + (x1 - x0) * k / 4
        parts.append(f'<text x="{sx(x):.1f}" y="{height - pad + 16}" text-anchor="middle">{x:.0f}</text>')
    for i, (name, c) in enumerate(curves):
        color = colors[i % len(colors)]
        pts = " ".join(f"{sx(s):.1f},{sy(l):.1f}" for s, l in c)
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{pts}"/>')
        parts.append(f'<text x="{width - pad}" y="{pad + 16 * i}" text-anchor="end" fill="{color}">{name}</text>')
    parts.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(parts) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--every", type=int, default=25)
    ap.add_argument("--svg")
    ap.add_argument("--last", type=int, default=50, help="mean loss over the last N steps, against the first run")
    a = ap.parse_args()
    data = [(run_name(r), *load(r)) for r in a.runs]
    curves = [(name, windows(steps, a.every)) for name, steps, _ in data]
    print("| run | params | tokens/s (median) | step ms | peak GPU GiB | final loss |")
    print("|---|---|---|---|---|---|")
    for name, steps, s in data:
        print(f"| {name} | {s['params'] / 1e6:.1f}M | {s['median_tokens_per_s']:,.0f} | "
              f"{s['median_step_time_s'] * 1e3:.1f} | {s['peak_device_bytes'] / 2**30:.2f} | {s['final_loss']:.4f} |")
    print()
    print("| step | " + " | ".join(n for n, _ in curves) + " |")
    print("|---|" + "---|" * len(curves))
    for k in range(max(len(c) for _, c in curves)):
        cells = [f"{c[k][1]:.4f}" if k < len(c) else "" for _, c in curves]
        step = next(c[k][0] for _, c in curves if k < len(c))
        print(f"| {step} | " + " | ".join(cells) + " |")
    print()
    print(f"| run | mean loss, last {a.last} steps | vs {data[0][0]} |")
    print("|---|---|---|")
    ref = None
    for name, steps, _ in data:
        tail = [r["loss"] for r in steps[-a.last:]]
        mean = sum(tail) / len(tail)
        ref = mean if ref is None else ref
        print(f"| {name} | {mean:.4f} | {100 * (mean / ref - 1):+.2f}% |")
    if a.svg:
        svg(curves, a.svg)


if __name__ == "__main__":
    run_cli(main)
