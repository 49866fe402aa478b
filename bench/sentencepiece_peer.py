"""tandem's SentencePiece encoders against the `sentencepiece` package, in one invocation.

The parity tests' models (tests/python/test_tokenizers_parity.py SP_KINDS: a BPE model with Llama
2's settings, three unigram models, BPE with SentencePiece's defaults, BPE without byte fallback and a
char model; --kinds picks some), trained here, and their 1 MB mix of scripts, emoji and whitespace
edge cases:
- one text: tandem.Tokenizer.encode against SentencePieceProcessor.encode, the best of --repeats;
- a corpus of --files copies of it: `tandem tokenize --threads N` (the tokens/s it prints: reading,
  encoding and writing, without the process's start and the model's load) against the package's
  encode(list, num_threads=N), the best of --repeats, for each N of --threads;
- the ids of both, compared (the token file holds the package's ids plus EOS per file).

    PYTHONPATH=build/python python3 bench/sentencepiece_peer.py --cli build/tandem
"""
import argparse
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests" / "python"))
import test_tokenizers_parity as parity  # noqa: E402  (the models and the text of the parity tests)
import tandem  # noqa: E402


def best_of(n, fn):
    times = []
    for _ in range(n):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def token_file(path):
    header = np.fromfile(path, dtype=np.int32, count=256)
    dtype = np.uint16 if header[0] == 20240520 else np.uint32
    return np.fromfile(path, dtype=dtype, offset=1024)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cli", default="build/tandem")
    ap.add_argument("--files", type=int, default=64)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kinds", default=",".join(parity.SP_KINDS), help="models of SP_KINDS, comma-separated")
    a = ap.parse_args()
    tmp = pathlib.Path(tempfile.mkdtemp())
    text = parity.mixed_text().replace("<sep>", "<se p>")  # no user-defined piece: tandem's own encoders
    corpus = tmp / "corpus"
    corpus.mkdir()
    for i in range(a.files):
        (corpus / f"{i:03d}.txt").write_text(text)
    rows = []
    print(f"text: {len(text.encode()) / 2**20:.2f} MiB; corpus: {a.files} files; machine: {os.cpu_count()} cores")
    for kind in a.kinds.split(","):
        path, ref = parity.sentencepiece_model(tmp, **parity.SP_KINDS[kind])
        tok = tandem.Tokenizer.open(path)
        t_ours, ours = best_of(a.repeats, lambda: tok.encode(text))
        t_ref, theirs = best_of(a.repeats, lambda: ref.encode(text))
        same = ours == theirs
        rows.append((kind, "one text, 1 thread", len(theirs), t_ours, t_ref, same))
        texts = [text] * a.files
        for n in [int(x) for x in a.threads.split(",")]:
            out = tmp / f"{kind}-{n}.bin"
            cmd = [a.cli, "tokenize", "--tokenizer", path, "--out", str(out), "--val-fraction", "0",
                   "--threads", str(n), str(corpus)]
            rates = []  # the command's own tokens/s: reading, encoding and writing, not its start-up
            for _ in range(a.repeats):
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode != 0:
                    sys.exit(f"tandem tokenize failed: {r.stderr.strip()}")
                rates.append(float(re.search(r"([0-9.]+) M tokens/s", r.stdout).group(1)) * 1e6)
            t_pkg, ids = best_of(a.repeats, lambda: ref.encode(texts, num_threads=n))
            expected = np.concatenate([np.array(x + [ref.eos_id()]) for x in ids])
            got = token_file(out)
            same = len(got) == len(expected) and bool((got == expected).all())
            rows.append((kind, f"tandem tokenize, {n} thread{'s' if n > 1 else ''}", len(expected),
                         len(expected) / max(rates), t_pkg, same))
    print("| model | run | tokens | tandem | sentencepiece package | tandem / package speed | same ids |")
    print("|---|---|---|---|---|---|---|")
    for kind, run, tokens, ours, theirs, same in rows:
        print(f"| {kind} | {run} | {tokens:,} | {ours * 1e3:.1f} ms ({tokens / ours / 1e6:.2f} M/s) | "
              f"{theirs * 1e3:.1f} ms ({tokens / theirs / 1e6:.2f} M/s) | {theirs / ours:.2f}x | {same} |")


if __name__ == "__main__":
    main()
