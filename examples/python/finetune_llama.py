"""Fine-tuning a transformers Llama with tandem's offload engine, from a plain PyTorch loop.

    .venv/bin/python examples/python/finetune_llama.py --model /models/Llama-3.2-1B --data data/ft.bin
    .venv/bin/python examples/python/finetune_llama.py            # a small Llama built from a config

The fp32 master weights and AdamW states live in host memory; the GPU holds bf16 working weights,
gradients stream to the CPU Block by Block while backward runs, and the checkpoint it writes is a
transformers folder (config.json + model.safetensors) that from_pretrained reads.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
import transformers

import tandem


def build(model_dir: str | None) -> transformers.PreTrainedModel:
    if model_dir:
        return transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    return transformers.LlamaForCausalLM(cfg)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="an HF model folder (default: a small Llama from a config)")
    ap.add_argument("--data", default="synthetic", help="a token file in the model's vocabulary, or 'synthetic'")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--out", default="runs/finetune-llama")
    args = ap.parse_args()
    torch.manual_seed(0)
    model = build(args.model)
    config = {"offload.optimizer": "cpu", "optim.lr": 2e-5 if args.model else 1e-3, "optim.warmup_steps": 5,
              "train.steps": args.steps, "train.precision": "bf16" if torch.cuda.is_available() else "fp32",
              "train.seq_len": args.seq_len, "train.micro_batch": args.batch, "data.path": args.data}
    engine = tandem.Engine(model, config, run_dir=args.out)
    batches = tandem.data.TokenBatches(config, vocab_size=model.config.vocab_size)
    for _, (x, y) in zip(range(args.steps), batches):
        logits = model(input_ids=x.to(engine.device)).logits
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.to(engine.device).view(-1))
        engine.backward(loss)
        info = engine.step()
        print(f"step {info.step:4d} | loss {loss.item():.4f} | grad norm {info.grad_norm:.3f} | "
              f"split k {engine.stats().get('split_k', 0):.2f}")
    path = engine.save()
    engine.close()
    print("checkpoint:", path, "(transformers.AutoModelForCausalLM.from_pretrained reads it)")


if __name__ == "__main__":
    main()
