#!/usr/bin/env python3
"""transformers' Trainer fine-tuning one model with the optimizer offloaded three ways, each side in a
process of its own, in one invocation:

  tandem    Trainer(optimizers=(tandem.optim.OffloadAdamW(...), None)): fp32 masters and moments in
            pinned host memory, updated on the CPU as backward runs (and on the GPU for the first
            Blocks, the split the engine solves); clipping at 1.0 inside the optimizer.
  torchao   Trainer(optimizers=(torchao.optim.CPUOffloadOptimizer(..., torch.optim.AdamW), None)):
            the host keeps a copy of each parameter in its dtype (bf16 here) and bf16 moments; no
            clipping (its gradients leave the GPU in backward hooks, where the Trainer's clip cannot see them).
  deepspeed Trainer(args.deepspeed=ZeRO-2 with offload_optimizer=cpu): DeepSpeedCPUAdam on fp32
            masters and moments in pinned host memory; clipping at 1.0.
  bound     no Trainer and no optimizer: the same model's forward and backward in a plain loop, the
            floor any optimizer placement can reach.

Every side builds the same model in bf16 on the GPU (seed 0), gradient checkpointing on, random
token rows, lr 1e-5 constant, no weight decay, one micro-batch per step. A side's figure is the
median time between the ends of consecutive steps after --warmup steps, as the Trainer's loop runs
them (data, forward, backward, update), with the GPU synchronised at each end. A side that fails
(out of memory, killed by the host) is a result: its row says how it ended.

  python3 bench/trainer_peers.py --shape mistral-7b --batch 4 --seq 4096 --json OUT.jsonl
  python3 bench/trainer_peers.py --shape tiny --device cpu --sides tandem   # a smoke run on a CPU
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_util import free_port  # noqa: E402

SHAPES = {  # MistralConfig fields
    "mistral-7b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=8, vocab_size=32000),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=256),
}
LR = 1e-5


def build_model(args):
    import torch
    import transformers

    fields = dict(SHAPES[args.shape])
    if args.layers:
        fields["num_hidden_layers"] = args.layers
    cfg = transformers.MistralConfig(**fields, max_position_embeddings=max(4096, args.seq), sliding_window=None,
                                     use_cache=False, tie_word_embeddings=False)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(args.device):  # built where it trains: no fp32 copy of a 7B model anywhere
            model = transformers.MistralForCausalLM(cfg)
    finally:
        torch.set_default_dtype(before)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


class Rows:
    """Random token rows (inputs are their own labels; the model shifts them)."""

    def __init__(self, n, seq, vocab):
        import torch

        self.ids = torch.randint(0, vocab, (n, seq), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def rss_gib():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) / 2**20


def step_timer():
    import torch
    import transformers

    class StepTimer(transformers.TrainerCallback):
        def __init__(self):
            self.ends = []

        def on_step_end(self, args, state, control, **kw):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.ends.append(time.perf_counter())
            print(f"step {state.global_step}: host RSS {rss_gib():.1f} GiB", file=sys.stderr, flush=True)

    return StepTimer()


def deepspeed_config():
    return {
        "bf16": {"enabled": "auto"},
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                              "overlap_comm": True, "contiguous_gradients": True,
                              "reduce_bucket_size": 5e8, "allgather_bucket_size": 5e8},
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                 "weight_decay": "auto"}},
        "gradient_clipping": "auto", "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto", "train_batch_size": "auto",
    }


def make_optimizer(side, model, args):
    import torch

    if side == "tandem":
        import tandem

        return tandem.optim.OffloadAdamW(model.parameters(), lr=LR, weight_decay=0.0, max_grad_norm=1.0,
                                         precision="bf16" if args.device == "cuda" else "fp32",
                                         config={"optim.state_dtype": args.state_dtype, "monitor.enabled": False,
                                                 **({"train.device": "cpu"} if args.device == "cpu" else {})})
    if side == "torchao":
        from torchao.optim import CPUOffloadOptimizer

        return CPUOffloadOptimizer(model.parameters(), torch.optim.AdamW, lr=LR, weight_decay=0.0, fused=True)
    return None  # deepspeed: the Trainer builds DeepSpeed's from the config


def run_trainer(side, args):
    import torch
    import transformers

    model = build_model(args)
    t0 = time.perf_counter()
    opt = make_optimizer(side, model, args)
    start_s = time.perf_counter() - t0
    steps = args.warmup + args.steps
    ta = transformers.TrainingArguments(
        output_dir=f"/tmp/trainer-peers-{side}", per_device_train_batch_size=args.batch, max_steps=steps,
        learning_rate=LR, lr_scheduler_type="constant", weight_decay=0.0,
        max_grad_norm=1.0 if side == "deepspeed" else 0.0,  # tandem clips in the optimizer; torchao cannot
        bf16=args.device == "cuda", gradient_checkpointing=True,
        gradient_checkpointing_kwargs={"use_reentrant": False}, logging_steps=1, report_to=[],
        save_strategy="no", seed=0, data_seed=0, dataloader_num_workers=0, use_cpu=args.device == "cpu",
        deepspeed=deepspeed_config() if side == "deepspeed" else None)
    timer = step_timer()
    trainer = transformers.Trainer(model=model, args=ta, train_dataset=Rows(args.batch * steps, args.seq,
                                                                            model.config.vocab_size),
                                   optimizers=(opt, None), callbacks=[timer])
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    row = timed_row(side, args, timer.ends, losses)
    row["optimizer_start_s"] = start_s
    if side == "tandem":
        row["split_k"] = opt.engine.stats().get("split_k")
        opt.engine.close()
    return row


def run_bound(args):
    import torch

    model = build_model(args)
    data = Rows(args.batch * (args.warmup + args.steps), args.seq, model.config.vocab_size)
    ends, losses = [], []
    for s in range(args.warmup + args.steps):
        x = data.ids[s * args.batch:(s + 1) * args.batch].to(args.device)
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        for p in model.parameters():
            p.grad = None
        losses.append(float(loss))  # synchronises with the GPU
        ends.append(time.perf_counter())
    return timed_row("bound", args, ends, losses)


def timed_row(side, args, ends, losses):
    import torch

    gaps = [b - a for a, b in zip(ends, ends[1:])][max(0, args.warmup - 1):]
    step_s = statistics.median(gaps) if gaps else float("nan")
    return {"side": side, "shape": args.shape, "layers": args.layers or SHAPES[args.shape]["num_hidden_layers"],
            "batch": args.batch, "seq": args.seq, "steps": len(gaps), "step_s": step_s,
            "tokens_per_s": args.batch * args.seq / step_s, "first_loss": losses[0] if losses else None,
            "last_loss": losses[-1] if losses else None,
            "peak_gpu_bytes": torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0,
            "peak_host_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def run_side_process(side, args):
    """One side in a child process (each starts with the GPU and host to itself); its last JSON line."""
    cmd = [sys.executable, os.path.abspath(__file__), "--side", side, "--shape", args.shape, "--batch",
           str(args.batch), "--seq", str(args.seq), "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--device", args.device, "--state-dtype", args.state_dtype, "--layers", str(args.layers)]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", LOCAL_RANK="0",
               WORLD_SIZE="1")
    base = {"side": side, "shape": args.shape, "layers": args.layers or SHAPES[args.shape]["num_hidden_layers"],
            "batch": args.batch, "seq": args.seq}
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    except subprocess.TimeoutExpired:
        return {**base, "error": f"no result in {args.timeout} s"}
    rows = [l for l in r.stdout.splitlines() if l.startswith("{")]
    if r.returncode == 0 and rows:
        return {**json.loads(rows[-1]), "wall_s": time.perf_counter() - t0}
    how = "killed by SIGKILL (the host's out-of-memory killer)" if r.returncode == -9 else f"exit {r.returncode}"
    tail = [l for l in (r.stderr or r.stdout).strip().splitlines() if l.strip()][-6:]
    return {**base, "error": how + ": " + " | ".join(tail)[-500:]}


def table(rows):
    bound = next((r["step_s"] for r in rows if r["side"] == "bound" and "step_s" in r), None)
    print(f"{'side':<10} {'layers':>6} {'step s':>8} {'tok/s':>8} {'x bound':>8} {'GPU GiB':>8} {'host GiB':>8}  loss")
    for r in rows:
        if "error" in r:
            print(f"{r['side']:<10} {r['layers']:>6}  {r['error'][:160]}")
            continue
        x = f"{r['step_s'] / bound:.2f}" if bound and r["side"] != "bound" else "-"
        print(f"{r['side']:<10} {r['layers']:>6} {r['step_s']:>8.3f} {r['tokens_per_s']:>8.0f} {x:>8} "
              f"{r['peak_gpu_bytes'] / 2**30:>8.1f} {r['peak_host_rss_bytes'] / 2**30:>8.1f}  "
              f"{r['first_loss']:.4f} -> {r['last_loss']:.4f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="mistral-7b")
    ap.add_argument("--layers", type=int, default=0, help="decoder layers (0: the shape's)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=6, help="measured steps after the warm-up")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--state-dtype", default="fp32", help="tandem's optim.state_dtype")
    ap.add_argument("--sides", default="bound,tandem,torchao,deepspeed")
    ap.add_argument("--timeout", type=int, default=420, help="seconds a side may take")
    ap.add_argument("--side", help=argparse.SUPPRESS)  # internal: run this one side here
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    if args.side:
        row = run_bound(args) if args.side == "bound" else run_trainer(args.side, args)
        print(json.dumps(row), flush=True)
        return
    rows = []
    for side in args.sides.split(","):
        row = run_side_process(side, args)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")
    table(rows)


if __name__ == "__main__":
    main()
