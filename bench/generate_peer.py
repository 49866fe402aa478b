"""Generation benchmark fixture and peer: writes a random-weight folder of a decoder family (Llama
by default; --preset llama3.2-1B, llama2-7B, qwen2.5-0.5B, gemma2-2B, mistral-7B) (transformers, bf16
safetensors, a byte-level BPE tokenizer trained here) and times transformers' own greedy batched
generate on it, for `tandem generate` on the same folder in the same run (scripts/gpu-check.sh, part
`serve`); then sets streamed runs against the PCIe bound in one table.

  python3 bench/generate_peer.py make DIR --layers 16 --hidden 2048 ...
  python3 bench/generate_peer.py make DIR --preset 13B
  python3 bench/generate_peer.py make DIR --preset gemma2-2B
  python3 bench/generate_peer.py time DIR --prompts FILE --max-tokens 128 [--max-gpu-gib 1.8]
  python3 bench/generate_peer.py table "LABEL=LOG" ... [--pcie-gbs 55]

`make` builds the model in bf16 on the GPU (where there is one), so 13B needs 26 GB of it and no fp32
copy. The prompt file decides the batch of `time`: every prompt is generated together.
"""

import argparse
import json
import os
import re
import time

import torch

# src/tandem/models/spec.cpp's shapes; the folder's vocabulary is the preset's, its tokenizer the
# small one trained here (a tokenizer smaller than the model is allowed: its ids are a subset).
PRESETS = {
    "llama3.2-1B": dict(layers=16, hidden=2048, heads=32, kv_heads=8, ffn=8192, model_vocab=128256, tie=True,
                        full_vocab=True),
    "13B": dict(layers=40, hidden=5120, heads=40, kv_heads=40, ffn=13824, model_vocab=32000),
    "llama2-7B": dict(layers=32, hidden=4096, heads=32, kv_heads=32, ffn=11008, model_vocab=32000),
    "qwen2.5-0.5B": dict(family="qwen2", layers=24, hidden=896, heads=14, kv_heads=2, ffn=4864, model_vocab=151936),
    "gemma2-2B": dict(family="gemma2", layers=26, hidden=2304, heads=8, kv_heads=4, ffn=9216, model_vocab=256000),
    "mistral-7B": dict(family="mistral", layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, model_vocab=32000),
}
# Llama-3.2-1B's shape: 1.24 B parameters, its 128256-token embedding tied to the output projection.
# Each family's published extras beside the shape (Qwen2.5 ties its embeddings at 0.5B; Gemma2-2B's
# head_dim, soft-caps and alternating 4096-token windows; Mistral's 4096-token window).
FAMILY_CONFIG = {
    "llama": ("LlamaConfig", {}),
    "qwen2": ("Qwen2Config", dict(tie_word_embeddings=True)),
    "gemma2": ("Gemma2Config", dict(head_dim=256, sliding_window=4096, attn_logit_softcapping=50.0,
                                    final_logit_softcapping=30.0, query_pre_attn_scalar=256)),
    "mistral": ("MistralConfig", dict(sliding_window=4096)),
}


def full_vocab_tokenizer(size):
    """A byte-level BPE of exactly `size` ids that decode to text: the 256 byte characters, then
    pairs and triples of the printable ASCII ones (space included), and <|eot_id|> last. A random
    model of a large vocabulary (Llama-3's 128256) then streams text from its first token, as a
    trained tokenizer of that size would; a small trained one leaves most sampled ids without text."""
    import tokenizers

    alphabet = sorted(tokenizers.pre_tokenizers.ByteLevel.alphabet())
    vocab, merges = {c: i for i, c in enumerate(alphabet)}, []
    ascii_ = [chr(b) for b in range(33, 127)] + ["\u0120"]  # ByteLevel's characters of bytes 33-126 and space
    pairs = [a + b for a in ascii_ for b in ascii_]
    for piece in pairs:
        if len(vocab) >= size - 1:
            break
        vocab[piece] = len(vocab)
        merges.append((piece[0], piece[1]))
    for piece in (p + c for p in pairs for c in ascii_):
        if len(vocab) >= size - 1:
            break
        vocab[piece] = len(vocab)
        merges.append((piece[:2], piece[2]))
    vocab["<|eot_id|>"] = len(vocab)
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=vocab, merges=merges))
    tok.add_special_tokens(["<|eot_id|>"])
    return tok


def make(args):
    import tokenizers
    import transformers

    for key, value in PRESETS.get(args.preset, {}).items():
        setattr(args, key, value)
    t0 = time.perf_counter()
    os.makedirs(args.dir, exist_ok=True)
    if args.full_vocab:
        tok = full_vocab_tokenizer(args.model_vocab)
    else:
        tok = tokenizers.Tokenizer(tokenizers.models.BPE())
        words = "the model trains on every tier of memory and serves text layer by layer".split()
        corpus = [" ".join(words[(i * 7 + j) % len(words)] for j in range(12)) for i in range(2000)]
        tok.train_from_iterator(corpus, tokenizers.trainers.BpeTrainer(
            vocab_size=args.vocab, special_tokens=["<|eot_id|>"],
            initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    tok.save(f"{args.dir}/tokenizer.json")
    with open(f"{args.dir}/tokenizer_config.json", "w") as f:
        json.dump({"eos_token": "<|eot_id|>"}, f)
    config_class, extra = FAMILY_CONFIG[args.family]
    extra = dict(extra)
    if args.tie:
        extra["tie_word_embeddings"] = True
    cfg = getattr(transformers, config_class)(
        vocab_size=args.model_vocab or tok.get_vocab_size(), hidden_size=args.hidden, intermediate_size=args.ffn,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        max_position_embeddings=4096, dtype="bfloat16", eos_token_id=tok.token_to_id("<|eot_id|>"), **extra)
    # Built in bf16 where it will be initialised (normal_, std 0.02, on the GPU): an fp32 13B is 52 GB.
    torch.set_default_dtype(torch.bfloat16)
    torch.manual_seed(args.seed)  # the same weights in every run: loads that stop at EOS stay comparable
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    torch.set_default_dtype(torch.float32)
    model.save_pretrained(args.dir, max_shard_size="5GB")  # shards, not one 26 GB file built in host memory
    n = sum(p.numel() for p in model.parameters())
    written = sum(e.stat().st_size for e in os.scandir(args.dir))
    print(f"wrote {args.dir}: {cfg.model_type}, {n / 1e9:.2f} B parameters, vocab {cfg.vocab_size} (tokenizer "
          f"{tok.get_vocab_size()}), {written / 1e9:.2f} GB in {time.perf_counter() - t0:.1f} s")


def device_map_summary(model):
    """One line: where accelerate put the decoder layers, the embedding and the output projection,
    and the bytes of the host's weights that each forward copies to the GPU."""
    dmap = model.hf_device_map

    def home(name):  # the device of the longest module name that holds `name`
        key = max((k for k in dmap if k == "" or name == k or name.startswith(k + ".")), key=len)
        return f"cuda:{dmap[key]}" if isinstance(dmap[key], int) else dmap[key]

    layers, moved = {}, 0
    for name, p in model.named_parameters():
        where = home(name)
        if where in ("cpu", "disk"):
            moved += p.numel() * p.element_size()
        m = re.match(r"model\.layers\.(\d+)\.", name)
        if m:
            layers[int(m.group(1))] = where
    on_host = sum(w in ("cpu", "disk") for w in layers.values())
    return (f"accelerate device map: {len(layers) - on_host} of {len(layers)} layers on the GPU, {on_host} on the "
            f"host ({moved / 2**30:.2f} GiB copied to the GPU a step); embedding on "
            f"{home('model.embed_tokens.weight')}, output projection on {home('lm_head.weight')}")


def timed(args):
    import tokenizers
    import transformers

    tok = tokenizers.Tokenizer.from_file(f"{args.dir}/tokenizer.json")
    prompts = [line.rstrip("\n") for line in open(args.prompts) if line.strip()]
    t0 = time.perf_counter()
    if args.max_gpu_gib:  # accelerate's CPU offload: what does not fit max_memory on the GPU stays on the host
        model = transformers.AutoModelForCausalLM.from_pretrained(
            args.dir, dtype=torch.bfloat16, device_map="auto",
            max_memory={0: f"{args.max_gpu_gib}GiB", "cpu": "400GiB"}).eval()
        print(f"{device_map_summary(model)}; loaded in {time.perf_counter() - t0:.1f} s")
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(args.dir, dtype=torch.bfloat16).cuda().eval()
    ids = [tok.encode(p).ids for p in prompts]
    width = max(len(i) for i in ids)
    pad = 0
    batch = torch.tensor([[pad] * (width - len(i)) + i for i in ids], device="cuda")
    mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids], device="cuda")
    kw = dict(max_new_tokens=args.max_tokens, min_new_tokens=args.max_tokens, do_sample=False, top_p=None,
              top_k=None, temperature=None, pad_token_id=pad)
    model.generate(batch[:, :8], attention_mask=mask[:, :8], max_new_tokens=4, do_sample=False, pad_token_id=pad)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    out = model.generate(batch, attention_mask=mask, **kw)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    generated = (out.shape[1] - width) * out.shape[0]
    how = f" (accelerate, GPU share {args.max_gpu_gib} GiB)" if args.max_gpu_gib else ""
    print(f"transformers generate{how}: {len(prompts)} prompts, {generated} generated in {dt:.2f} s: "
          f"{generated / dt:.1f} tokens/s, peak GPU {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")


UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def streamed_run(log):
    """The figures of one streamed run, a log of `tandem generate` or of `time --max-gpu-gib`: prompts
    (all decoded together), layers on the GPU, weight bytes copied to the GPU a decode step, tokens/s,
    peak GPU memory; None when the log has no finished streamed run."""
    text = open(log, errors="replace").read()
    if m := re.search(r"(\d+) of (\d+) layers on the GPU, \d+ on the host \(([\d.]+) GiB copied", text):
        run = dict(gpu_layers=f"{m[1]} of {m[2]}", step_bytes=float(m[3]) * 2**30)
        m = re.search(r"transformers generate.*: (\d+) prompts, \d+ generated in [\d.]+ s: ([\d.]+) tokens/s, "
                      r"peak GPU ([\d.]+ GiB)", text)
    elif m := re.search(r"(\d+) of (\d+) layers resident, \d+ streamed from pinned host memory \(([\d.]+) (\w+)\)",
                        text):
        run = dict(gpu_layers=f"{m[1]} of {m[2]}", step_bytes=float(m[3]) * UNITS[m[4]])
        m = re.search(r"(\d+) prompts?, \d+ prompt tokens, \d+ generated in [\d.]+ s: ([\d.]+) tokens/s.*"
                      r"peak memory ([\d.]+ \w+) GPU", text)
    if not m:
        return None
    return dict(run, prompts=int(m[1]), tokens_s=float(m[2]), peak=m[3])


def table(args):
    print(f"| run | layers on the GPU | weights streamed a step | tokens/s | PCIe bound ({args.pcie_gbs:g} GB/s) "
          f"| of the bound | peak GPU |")
    print("|---|---|---|---|---|---|---|")
    for item in args.logs:
        label, _, log = item.rpartition("=")
        run = streamed_run(log) if os.path.exists(log) else None
        if run is None:
            print(f"| {label or log} | no result in {log} | | | | | |")
            continue
        # A decode step of the whole batch copies every streamed layer once.
        bound = run["prompts"] * args.pcie_gbs * 1e9 / run["step_bytes"] if run["step_bytes"] else 0
        versus = f"{bound:.1f} | {run['tokens_s'] / bound:.0%}" if bound else "| "
        print(f"| {label or log} | {run['gpu_layers']} | {run['step_bytes'] / 2**30:.2f} GiB | {run['tokens_s']:.1f} "
              f"| {versus} | {run['peak']} |")

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    mk = sub.add_parser("make", help="write a random-weight folder of a decoder family")
    mk.add_argument("dir")
    mk.add_argument("--preset", choices=sorted(PRESETS), help="tandem's preset shape; overrides the shape flags")
    mk.add_argument("--family", choices=sorted(FAMILY_CONFIG), default="llama")
    mk.add_argument("--layers", type=int, default=16)
    mk.add_argument("--hidden", type=int, default=2048)
    mk.add_argument("--ffn", type=int, default=5632)
    mk.add_argument("--heads", type=int, default=32)
    mk.add_argument("--kv-heads", type=int, default=8)
    mk.add_argument("--vocab", type=int, default=8000, help="the BPE tokenizer's target size")
    mk.add_argument("--model-vocab", type=int, default=0, help="the model's vocabulary (default: the tokenizer's)")
    mk.add_argument("--tie", action="store_true", help="tie the output projection to the embedding")
    mk.add_argument("--full-vocab", action="store_true",
                    help="a tokenizer of the model's whole vocabulary, every id text (full_vocab_tokenizer)")
    mk.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    tm = sub.add_parser("time", help="time transformers' greedy generate on a folder")
    tm.add_argument("dir")
    tm.add_argument("--prompts", required=True, help="one prompt a line, all generated as one batch")
    tm.add_argument("--max-tokens", type=int, default=128)
    tm.add_argument("--max-gpu-gib", type=float, default=0,
                    help="load with device_map=auto and this GPU share, the rest offloaded to the host")
    tb = sub.add_parser("table", help="streamed runs against the PCIe bound, one markdown row per log")
    tb.add_argument("logs", nargs="+", help="LABEL=LOG: a log of `tandem generate` or of `time --max-gpu-gib`")
    tb.add_argument("--pcie-gbs", type=float, default=55, help="host-to-GPU bandwidth, GB/s")
    args = ap.parse_args()
    {"make": make, "time": timed, "table": table}[args.what](args)


if __name__ == "__main__":
    main()
