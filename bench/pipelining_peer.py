#!/usr/bin/env python3
"""The peer for tandem's pipeline benchmark: the identical LLaMA-style architecture (bench/pytorch_llama.py)
cut into one stage per GPU and trained with torch.distributed.pipelining (Schedule1F1B or ScheduleGPipe),
bf16 autocast inside each stage, fused AdamW per stage, global-norm clipping over the stages, one host
sync per step.

Started by torchrun, one process per stage (`python3 -m torch.distributed.run --nproc-per-node 2
bench/pipelining_peer.py --model-config model_config.json --micro-batch 8 --micro-batches 8`). Stage s
takes an equal share of the decoder layers; the first also embeds, the last holds the final norm, the
head and the loss: tandem's dist.pipeline_cut=even on the same Block count. Each step draws
micro-batch x micro-batches rows of random tokens (the same on every rank). The last stage prints one
JSON line and writes it to --json: tokens/s of the whole pipeline, the median step time, the losses.
--device cpu (Gloo) only dry-runs the code path.
"""
import argparse
import json
import math
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from pytorch_llama import Model


class Stage(nn.Module):
    """Layers [lo, hi) of `full`, with the embedding on the first stage and the head on the last."""

    def __init__(self, full, lo, hi, first, last, device_type):
        super().__init__()
        self.first, self.last, self.device_type = first, last, device_type
        self.embed = full.embed if first else None
        self.layers = nn.ModuleList(full.layers[lo:hi])
        self.norm = full.norm if last else None
        self.lm_head = full.lm_head if last else None
        self.eps, self.vocab = full.eps, full.vocab
        self.register_buffer("cos", full.cos, persistent=False)
        self.register_buffer("sin", full.sin, persistent=False)

    def forward(self, x):
        with torch.autocast(self.device_type, dtype=torch.bfloat16):
            if self.first:
                x = self.embed(x)
            T = x.shape[1]
            cos, sin = self.cos[:T].to(torch.bfloat16), self.sin[:T].to(torch.bfloat16)
            for layer in self.layers:
                x = layer(x, cos, sin)
            if not self.last:
                return x
            h = F.rms_norm(x, (x.shape[-1],), self.norm, self.eps)
            return F.linear(h, self.lm_head.weight)[..., : self.vocab]


class PassTimer:
    """Each forward and backward pass of the stage (and the step's update) timed by CUDA events on the
    compute stream, as tandem's pipeline trace times its passes (Note [Pipeline pass timing]): a pass
    starts once its message has arrived on the stream. The ranks' tracks are aligned by the host's wall
    clock at the first pass, as tandem's are; the step's passes go to a Chrome trace, one track a stage."""

    def __init__(self, stage, dev):
        self.on, self.dev, self.spans, self.host0 = False, dev, [], None
        fwd, bwd = stage.forward_one_chunk, stage.backward_one_chunk

        def forward_one_chunk(chunk, *args, **kwargs):
            self.begin(f"F{chunk}")
            out = fwd(chunk, *args, **kwargs)
            self.end()
            return out

        def backward_one_chunk(chunk, *args, **kwargs):
            self.begin(f"B{chunk}")
            out = bwd(chunk, *args, **kwargs)
            self.end()
            return out

        stage.forward_one_chunk, stage.backward_one_chunk = forward_one_chunk, backward_one_chunk

    def begin(self, name):
        if not self.on:
            return
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        if self.host0 is None:
            self.host0 = time.time()
        self.spans.append([name, e, None])

    def end(self):
        if not self.on:
            return
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        self.spans[-1][2] = e

    def extend(self):
        """The last pass ends now (the last stage's loss, taken by the schedule after its forward)."""
        if self.on and self.spans:
            self.end()

    def write(self, path, rank, world, step):
        torch.cuda.synchronize()
        first = self.spans[0][1] if self.spans else None
        mine = [(n, first.elapsed_time(a) / 1e3, first.elapsed_time(b) / 1e3) for n, a, b in self.spans]
        gathered = [None] * world
        dist.all_gather_object(gathered, (self.host0 or 0.0, mine))
        if rank != world - 1:
            return
        origin = min(h for h, _ in gathered)
        events = [{"name": "thread_name", "ph": "M", "pid": 1, "tid": r, "args": {"name": f"stage {r}"}}
                  for r in range(world)]
        for r, (h, spans) in enumerate(gathered):
            for n, a, b in spans:
                events.append({"name": n, "cat": f"step {step}", "ph": "X", "pid": 1, "tid": r,
                               "ts": (h - origin + a) * 1e6, "dur": (b - a) * 1e6})
        json.dump({"displayTimeUnit": "ms", "traceEvents": events}, open(path, "w"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-config", required=True, help="model_config.json from a tandem run directory")
    ap.add_argument("--micro-batch", type=int, default=8, help="rows per micro-batch")
    ap.add_argument("--micro-batches", type=int, default=8, help="micro-batches per step")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--schedule", default="1f1b", choices=["1f1b", "gpipe"])
    ap.add_argument("--json", default="")
    ap.add_argument("--trace-step", type=int, default=4,
                    help="the step (1-based) whose passes are timed on the GPU and written to <json>.trace.json (0: none)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    a = ap.parse_args()
    c = json.load(open(a.model_config))
    assert not c.get("tie_word_embeddings", False), "a tied embedding cannot be cut into stages"
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    cuda = a.device == "cuda"
    dev = torch.device(f"cuda:{int(os.environ['LOCAL_RANK'])}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(dev)
        torch.backends.cuda.matmul.allow_tf32 = True
    dist.init_process_group("nccl" if cuda else "gloo", device_id=dev if cuda else None)
    torch.manual_seed(0)
    with torch.device("meta"):
        full = Model(c)  # every stage's shapes; each stage materialises only its own part
    L = c["num_hidden_layers"]
    lo, hi = rank * L // world, (rank + 1) * L // world
    first, last = rank == 0, rank == world - 1
    stage_mod = Stage(full, lo, hi, first, last, dev.type).to_empty(device=dev)
    with torch.no_grad():
        for name, p in stage_mod.named_parameters():
            if name.startswith("norm") or "layernorm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
        hd = c["hidden_size"] // c["num_attention_heads"]
        inv = 1.0 / (c.get("rope_theta", 10000.0) ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        f = torch.outer(torch.arange(c["max_position_embeddings"], dtype=torch.float64), inv)
        e = torch.cat((f, f), -1)
        stage_mod.cos.copy_(e.cos().float())
        stage_mod.sin.copy_(e.sin().float())
    stage = PipelineStage(stage_mod, rank, world, dev)
    timed = PassTimer(stage, dev) if cuda and a.json and a.trace_step > 0 else None

    def loss_fn(logits, targets):
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
        if timed:
            timed.extend()  # the schedule takes the loss after the forward pass: it belongs to that pass
        return loss

    Sched = Schedule1F1B if a.schedule == "1f1b" else ScheduleGPipe
    schedule = Sched(stage, n_microbatches=a.micro_batches, loss_fn=loss_fn)
    params = list(stage_mod.parameters())
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8, fused=cuda)
    gen = torch.Generator(device=dev)
    gen.manual_seed(0)  # the same tokens on every rank: the first stage reads the inputs, the last the targets
    rows = a.micro_batch * a.micro_batches
    vocab = c["vocab_size"]
    times, losses = [], []
    for step in range(a.steps):
        t0 = time.perf_counter()
        if timed:
            timed.on = step + 1 == a.trace_step  # 1-based, as tandem's dist.pipeline_trace_steps
        x = torch.randint(0, vocab, (rows, a.seq + 1), device=dev, generator=gen)
        step_losses = []
        if first:
            schedule.step(x[:, :-1].contiguous())
        elif last:
            schedule.step(target=x[:, 1:].contiguous(), losses=step_losses)
        else:
            schedule.step()
        # Global-norm clipping over the stages, as tandem's: the squared norms summed, one all-reduce.
        sq = torch.stack([p.grad.float().pow(2).sum() for p in params if p.grad is not None]).sum()
        dist.all_reduce(sq)
        coef = torch.clamp(1.0 / (sq.sqrt() + 1e-6), max=1.0)
        for p in params:
            if p.grad is not None:
                p.grad.mul_(coef)
        if timed and timed.on:
            timed.begin("U")
        opt.step()
        opt.zero_grad(set_to_none=True)
        if timed and timed.on:
            timed.end()
        loss = torch.stack(step_losses).mean() if last else torch.zeros((), device=dev)
        dist.broadcast(loss, world - 1)
        losses.append(loss.item())  # the one host sync per step
        times.append(time.perf_counter() - t0)
    steady = times[a.warmup:]
    med = statistics.median(steady)
    tokens = rows * a.seq
    n_params = sum(p.numel() for p in full.parameters()) - (full.padded - full.vocab) * c["hidden_size"] * 2
    flops = 6 * n_params * tokens + 12 * L * c["hidden_size"] * a.seq * tokens
    out = {
        "impl": "torch.distributed.pipelining",
        "schedule": a.schedule,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name() if cuda else "cpu",
        "stages": world,
        "params": n_params,
        "micro_batch": a.micro_batch,
        "micro_batches": a.micro_batches,
        "seq": a.seq,
        "steps": a.steps,
        "median_step_time_s": med,
        "tokens_per_s": tokens / med,
        "tflops": flops / med / 1e12,
        "peak_mem_bytes": torch.cuda.max_memory_allocated() if cuda else 0,
        "losses": losses,
        "loss_finite": all(math.isfinite(v) for v in losses),
    }
    if timed:
        timed.write(a.json + ".trace.json", rank, world, a.trace_step)
    if last:
        print(json.dumps({k: v for k, v in out.items() if k != "losses"}))
        if a.json:
            json.dump(out, open(a.json, "w"), indent=2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
