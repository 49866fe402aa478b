"""Small models and the reference loop the `tandem` package's tests compare against."""

from __future__ import annotations

import os
import sys
from typing import Callable, Dict, List, Tuple

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples", "python"))

from nanogpt import GPT  # noqa: E402

VOCAB, SEQ, BATCH = 128, 16, 4
LR, CLIP, WD, BETAS = 3e-3, 0.5, 0.1, (0.9, 0.95)


def tiny_llama(tied: bool = False):
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   tie_word_embeddings=tied)
    return transformers.LlamaForCausalLM(cfg)


def tiny_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(vocab_size=VOCAB, block_size=SEQ, n_layer=2, n_head=4, n_embd=32)


def batch(step: int, rows: slice = slice(None)) -> Tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    return x[rows, :-1], x[rows, 1:]


def loss_of(model, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = model(x)
    logits = out.logits if hasattr(out, "logits") else out
    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1))


def engine_config(offload: bool, **extra) -> Dict[str, object]:
    cfg: Dict[str, object] = {
        "train.device": "cpu", "train.precision": "fp32", "offload.optimizer": "cpu" if offload else "none",
        "optim.lr": LR, "optim.schedule": "constant", "optim.warmup_steps": 0, "optim.beta1": BETAS[0],
        "optim.beta2": BETAS[1], "optim.weight_decay": WD, "train.grad_clip": CLIP, "monitor.enabled": False,
    }
    cfg.update(extra)
    return cfg


def reference_losses(model, steps: int) -> Tuple[List[float], List[float]]:
    """Plain torch.optim.AdamW (decay on 2-D and larger parameters) with clip_grad_norm_."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": WD},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=1e-8, foreach=False)
    losses, norms = [], []
    for s in range(steps):
        loss = loss_of(model, *batch(s))
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(params, CLIP)))
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, norms


def engine_losses(model, engine, steps: int, first: int = 0) -> Tuple[List[float], List[float]]:
    losses, norms = [], []
    for s in range(first, first + steps):
        loss = loss_of(model, *batch(s))
        engine.backward(loss)
        info = engine.step()
        losses.append(loss.item())
        norms.append(info.grad_norm)
    return losses, norms


def assert_close(a: List[float], b: List[float], rel: float) -> None:
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        assert abs(x - y) <= rel * max(abs(x), abs(y)), f"step {i + 1}: {x!r} vs {y!r} (rel {rel})"
