"""A nanoGPT-style model defined here, trained by tandem's engine from a plain PyTorch loop.

    .venv/bin/python examples/python/nanogpt.py                        # on the generated corpus
    .venv/bin/python examples/python/nanogpt.py --data data/train.bin --offload --steps 200
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn

import tandem


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2 shape: token and position embeddings, n_layer Blocks in transformer.h, a final
    LayerNorm and a head tied to the token embedding."""

    def __init__(self, vocab_size: int = 256, block_size: int = 64, n_layer: int = 4, n_head: int = 4,
                 n_embd: int = 64) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd),
            wpe=nn.Embedding(block_size, n_embd),
            h=nn.ModuleList([Block(n_embd, n_head) for _ in range(n_layer)]),
            ln_f=nn.LayerNorm(n_embd),
        ))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied: one parameter, in the embedding Block
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02 / (math.sqrt(2 * n_layer) if name.endswith("c_proj.weight") else 1.0))
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="synthetic", help="a token file (nanoGPT/llm.c .bin) or 'synthetic'")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--offload", action="store_true", help="masters and AdamW states on the CPU")
    args = ap.parse_args()
    torch.manual_seed(0)
    model = GPT()
    config = {"optim.lr": 3e-3, "optim.warmup_steps": 10, "train.steps": args.steps, "train.seq_len": 64,
              "train.micro_batch": 16, "data.path": args.data,
              "offload.optimizer": "cpu" if args.offload else "none"}
    engine = tandem.Engine(model, config)
    batches = tandem.data.TokenBatches(config, vocab_size=256)
    for _, (x, y) in zip(range(args.steps), batches):
        loss = model(x.to(engine.device), y.to(engine.device))
        engine.backward(loss)
        info = engine.step()
        if info.step % 10 == 0 or info.step == 1:
            print(f"step {info.step:4d} | loss {loss.item():.4f} | lr {info.lr:.2e} | grad norm {info.grad_norm:.3f}")
    print("saved", engine.save())
    engine.close()


if __name__ == "__main__":
    main()
