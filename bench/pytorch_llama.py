#!/usr/bin/env python3
"""The peer for tandem's single-GPU benchmark: the identical LLaMA-style architecture trained in
plain PyTorch eager (bf16 autocast, fused AdamW, global-norm clipping, one host sync per step).

The architecture is read from the model_config.json that `tandem train` writes into its run
directory, so both sides train the same shapes. Prints one JSON line and writes it to --json.

Data parallel: started by torchrun with WORLD_SIZE > 1 (`python3 -m torch.distributed.run
--nproc-per-node N bench/pytorch_llama.py ...`), each rank trains on cuda:LOCAL_RANK inside
DistributedDataParallel (NCCL, default buckets, gradient_as_bucket_view) on its own random tokens,
--batch rows per rank (weak scaling). Rank 0 alone prints and writes the JSON: impl "pytorch-ddp",
"world_size" added, tokens_per_s and tflops counting every rank's tokens, peak_mem_bytes rank 0's.
One process without torchrun's WORLD_SIZE runs exactly as before, with no process group.
--device cpu (Gloo for DDP) only dry-runs the code path on a machine without a GPU.
"""
import argparse
import json
import math
import os
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, h, kv, ff = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["intermediate_size"]
        self.h, self.kv, self.hd, self.eps = h, kv, d // h, c["rms_norm_eps"]
        self.input_layernorm = nn.Parameter(torch.ones(d))
        self.post_attention_layernorm = nn.Parameter(torch.ones(d))
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, kv * self.hd, bias=False)
        self.v_proj = nn.Linear(d, kv * self.hd, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.gate_proj = nn.Linear(d, ff, bias=False)
        self.up_proj = nn.Linear(d, ff, bias=False)
        self.down_proj = nn.Linear(ff, d, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        h = F.rms_norm(x, (C,), self.input_layernorm, self.eps)
        q = self.q_proj(h).view(B, T, self.h, self.hd).transpose(1, 2)
        k = self.k_proj(h).view(B, T, self.kv, self.hd).transpose(1, 2)
        v = self.v_proj(h).view(B, T, self.kv, self.hd).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv != self.h)
        r = x + self.o_proj(y.transpose(1, 2).reshape(B, T, C))
        g = F.rms_norm(r, (C,), self.post_attention_layernorm, self.eps)
        return r + self.down_proj(F.silu(self.gate_proj(g)) * self.up_proj(g))


def rope(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, self.vocab = c["hidden_size"], c["vocab_size"]
        self.padded = (self.vocab + 63) // 64 * 64
        self.eps = c["rms_norm_eps"]
        self.embed = nn.Embedding(self.padded, d)
        self.layers = nn.ModuleList(Layer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = nn.Parameter(torch.ones(d))
        self.tied = c.get("tie_word_embeddings", False)
        self.lm_head = None if self.tied else nn.Linear(d, self.padded, bias=False)
        hd = d // c["num_attention_heads"]
        inv = 1.0 / (c.get("rope_theta", 10000.0) ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        f = torch.outer(torch.arange(c["max_position_embeddings"], dtype=torch.float64), inv)
        e = torch.cat((f, f), -1)
        self.register_buffer("cos", e.cos().float(), persistent=False)
        self.register_buffer("sin", e.sin().float(), persistent=False)

    def forward(self, tokens, targets):
        T = tokens.shape[1]
        x = self.embed(tokens)
        cos, sin = self.cos[:T].to(torch.bfloat16), self.sin[:T].to(torch.bfloat16)
        for layer in self.layers:
            x = layer(x, cos, sin)
        h = F.rms_norm(x, (x.shape[-1],), self.norm, self.eps)
        logits = F.linear(h, self.embed.weight if self.tied else self.lm_head.weight)
        if self.padded != self.vocab:
            logits = logits[..., : self.vocab]
        return F.cross_entropy(logits.reshape(-1, self.vocab).float(), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-config", required=True, help="model_config.json from a tandem run directory")
    ap.add_argument("--batch", type=int, default=8, help="rows per step (per rank under torchrun)")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=6)
    ap.add_argument("--json", default="")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: a dry run of the code path (Gloo for DDP); its timings mean nothing")
    a = ap.parse_args()
    c = json.load(open(a.model_config))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    ddp = world > 1
    cuda = a.device == "cuda"
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    dev = a.device
    if ddp:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
        if cuda:
            torch.cuda.set_device(local_rank)
            dev = f"cuda:{local_rank}"
        dist.init_process_group("nccl" if cuda else "gloo")
    m = Model(c).to(dev)
    decay = [p for p in m.parameters() if p.dim() >= 2]
    no_decay = [p for p in m.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    n_params = sum(p.numel() for p in m.parameters()) - (m.padded - m.vocab) * c["hidden_size"] * (1 if m.tied else 2)
    net, gen = m, None  # one process: the global generators, as always
    if ddp:
        # The same initial weights everywhere (seed 0; DDP also broadcasts rank 0's), each rank
        # its own tokens.
        net = DistributedDataParallel(m, device_ids=[local_rank] if cuda else None, gradient_as_bucket_view=True)
        gen = torch.Generator(device=dev)
        gen.manual_seed(rank)
    times, losses = [], []
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for step in range(a.steps):
        t0 = time.perf_counter()
        x = torch.randint(0, m.vocab, (a.batch, a.seq + 1), device=dev, generator=gen)
        with torch.autocast(a.device, dtype=torch.bfloat16):
            loss = net(x[:, :-1], x[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)  # gradients already averaged over ranks
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())  # the one host sync per step, as in tandem
        times.append(time.perf_counter() - t0)
    steady = times[a.warmup:]
    med = statistics.median(steady)
    tokens = a.batch * a.seq * world  # every rank's: global tokens per step
    L, d = c["num_hidden_layers"], c["hidden_size"]
    flops = 6 * n_params * tokens + 12 * L * d * a.seq * tokens
    out = {
        "impl": "pytorch-ddp" if ddp else "pytorch-eager",
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name() if cuda else "cpu",
        "params": n_params,
        "batch": a.batch,
        "seq": a.seq,
        "steps": a.steps,
        "median_step_time_s": med,
        "min_step_time_s": min(steady),
        "max_step_time_s": max(steady),
        "tokens_per_s": tokens / med,
        "tflops": flops / med / 1e12,
        "peak_mem_bytes": torch.cuda.max_memory_allocated() if cuda else 0,
        "final_loss": losses[-1],
        "loss_finite": all(math.isfinite(v) for v in losses),
    }
    if ddp:
        out["world_size"] = world
        dist.destroy_process_group()
    if rank == 0:
        print(json.dumps(out))
        if a.json:
            json.dump(out, open(a.json, "w"), indent=2)


if __name__ == "__main__":
    main()
