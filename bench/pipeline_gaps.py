#!/usr/bin/env python3
"""Where a pipeline step's time goes, from Chrome traces of its passes: tandem's pipeline_trace.json
(dist.pipeline_trace_steps) and bench/pipelining_peer.py's <json>.trace.json, both timed by CUDA
events on each stage's compute stream. Per stage: the passes' busy time, the span from the first
stage's first pass to this stage's last, and the idle gaps between its passes (the largest named).

    python3 bench/pipeline_gaps.py tandem=run/pipeline_trace.json peer=peer.json.trace.json
"""
import json
import sys


def stages(path):
    """{track: [(name, start_us, end_us)]} of a trace's complete ("X") events, each track sorted."""
    out = {}
    for e in json.load(open(path))["traceEvents"]:
        if e.get("ph") == "X":
            out.setdefault(e["tid"], []).append((e["name"], e["ts"], e["ts"] + e["dur"]))
    return {t: sorted(v, key=lambda s: s[1]) for t, v in sorted(out.items())}


def describe(label, path, top=3):
    tracks = stages(path)
    origin = min(v[0][1] for v in tracks.values())
    for tid, spans in tracks.items():
        passes = [s for s in spans if s[0][0] in "FB"]
        busy = sum(b - a for _, a, b in passes)
        gaps = sorted(((passes[i + 1][1] - passes[i][2], passes[i][0] + ">" + passes[i + 1][0])
                       for i in range(len(passes) - 1)), reverse=True)
        idle = sum(g for g, _ in gaps if g > 0)
        worst = ", ".join(f"{n} {g / 1e3:.2f}" for g, n in gaps[:top])
        extra = "".join(f"; {n} {(b - a) / 1e3:.2f} ms" for n, a, b in spans if n[0] not in "FB")
        print(f"{label} stage {tid}: {len(passes)} passes, busy {busy / 1e3:.1f} ms, first at {(passes[0][1] - origin) / 1e3:.2f}, "
              f"last ends {(passes[-1][2] - origin) / 1e3:.1f} ms; gaps {idle / 1e3:.2f} ms (largest: {worst}){extra}")


def main():
    for arg in sys.argv[1:]:
        label, _, path = arg.rpartition("=")
        try:
            describe(label or path, path)
        except (OSError, ValueError, KeyError) as e:
            print(f"{label or path}: no trace ({e})")


if __name__ == "__main__":
    main()
