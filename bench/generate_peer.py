"""Generation benchmark fixture and peer: writes a random-weight Llama folder (transformers, bf16
safetensors, a byte-level BPE tokenizer trained here) and times transformers' own greedy batched
generate on it, for `tandem generate` on the same folder in the same run (scripts/gpu-check.sh, part
`serve`).

  python3 bench/generate_peer.py make DIR --layers 16 --hidden 2048 ...
  python3 bench/generate_peer.py time DIR --prompts FILE --max-tokens 128 [--max-gpu-gib 1.8]
"""

import argparse
import json
import time

import torch


def make(args):
    import tokenizers
    import transformers

    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    words = "the model trains on every tier of memory and serves text layer by layer".split()
    corpus = [" ".join(words[(i * 7 + j) % len(words)] for j in range(12)) for i in range(2000)]
    tok.train_from_iterator(corpus, tokenizers.trainers.BpeTrainer(
        vocab_size=args.vocab, special_tokens=["<|eot_id|>"], initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))
    tok.save(f"{args.dir}/tokenizer.json")
    with open(f"{args.dir}/tokenizer_config.json", "w") as f:
        json.dump({"eos_token": "<|eot_id|>"}, f)
    cfg = transformers.LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=args.hidden,
                                   intermediate_size=args.ffn, num_hidden_layers=args.layers,
                                   num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                                   max_position_embeddings=4096, torch_dtype="bfloat16",
                                   eos_token_id=tok.token_to_id("<|eot_id|>"))
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(args.dir)
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {args.dir}: {n / 1e9:.2f} B parameters, vocab {cfg.vocab_size}")


def timed(args):
    import tokenizers
    import transformers

    tok = tokenizers.Tokenizer.from_file(f"{args.dir}/tokenizer.json")
    prompts = [line.rstrip("\n") for line in open(args.prompts) if line.strip()]
    if args.max_gpu_gib:  # accelerate's CPU offload: what does not fit max_memory on the GPU stays on the host
        model = transformers.LlamaForCausalLM.from_pretrained(
            args.dir, torch_dtype=torch.bfloat16, device_map="auto",
            max_memory={0: f"{args.max_gpu_gib}GiB", "cpu": "400GiB"}).eval()
    else:
        model = transformers.LlamaForCausalLM.from_pretrained(args.dir, torch_dtype=torch.bfloat16).cuda().eval()
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["make", "time"])
    ap.add_argument("dir")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--ffn", type=int, default=5632)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--prompts")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-gpu-gib", type=float, default=0,
                    help="time: load with device_map=auto and this GPU share, the rest offloaded to the host")
    args = ap.parse_args()
    make(args) if args.what == "make" else timed(args)


if __name__ == "__main__":
    main()
