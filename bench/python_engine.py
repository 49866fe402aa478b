#!/usr/bin/env python3
"""tandem's Python package against its peers on one GPU, each in the same invocation.

  resident: a transformers Llama trained by a plain PyTorch loop (bf16 autocast, fused AdamW,
            clipping) and by tandem.Engine without offload, alternating runs.
  offload:  the same transformers Llama through tandem.Engine(offload.optimizer=cpu), the CLI
            (`tandem train`) on the same architecture, and torchao's CPUOffloadOptimizer.

The architecture is a tandem preset's (`tandem train` writes it as model_config.json), so every
side trains the same shapes. Each side prints one JSON line (impl, tokens_per_s, step_s, ...).

  python3 bench/python_engine.py resident --preset 1B --batch 8 --seq 2048
  python3 bench/python_engine.py offload --preset 7B --batch 8 --seq 2048 --checkpointing
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_util import one_line  # noqa: E402
from run_dir import read_summary  # noqa: E402


def cli_run(args, extra, run_dir, steps):
    """`tandem train` on the preset; returns its run directory's summary (and model_config.json)."""
    cmd = [args.cli, "train", "-p", args.preset, "--run-dir", run_dir, "--set", f"train.steps={steps}",
           "--set", f"train.micro_batch={args.batch}", "--set", f"train.seq_len={args.seq}",
           "--set", "train.precision=bf16", "--set", "train.checkpoint_every=0", "--set", "train.eval_every=0",
           "--set", f"model.checkpointing={'true' if args.checkpointing else 'false'}",
           "--set", "train.save_final=false", "--set", "train.progress=off"] + extra
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("tandem train failed: " + r.stderr[-2000:])
    return read_summary(run_dir), time.perf_counter() - t0


def hf_model(config_path, checkpointing):
    import transformers

    cfg = transformers.LlamaConfig.from_json_file(config_path)
    cfg.use_cache = False
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def timed_loop(model, step_fn, args, device, label):
    """Runs warmup + steps of step_fn(x, y); returns the JSON row."""
    vocab = model.config.vocab_size
    g = torch.Generator(device="cpu").manual_seed(0)
    times = []
    for s in range(args.warmup + args.steps):
        x = torch.randint(0, vocab, (args.batch, args.seq + 1), generator=g).to(device)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = step_fn(x[:, :-1], x[:, 1:])
        torch.cuda.synchronize()
        if s >= args.warmup:
            times.append(time.perf_counter() - t0)
    step_s = statistics.median(times)
    return {"impl": label, "preset": args.preset, "batch": args.batch, "seq": args.seq, "step_s": step_s,
            "tokens_per_s": args.batch * args.seq / step_s, "last_loss": float(loss),
            "peak_gpu_bytes": torch.cuda.max_memory_allocated(device)}


def ce(model, x, y):
    logits = model(input_ids=x).logits
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1))


def plain_pytorch(config_path, args, device):
    model = hf_model(config_path, args.checkpointing).to(device)
    params = [p for p in model.parameters()]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), fused=True)

    def step(x, y):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = ce(model, x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    torch.cuda.reset_peak_memory_stats(device)
    row = timed_loop(model, step, args, device, "pytorch-eager")
    del model, opt
    return row


def tandem_engine(config_path, args, device, offload):
    import tandem

    model = hf_model(config_path, args.checkpointing)
    t0 = time.perf_counter()
    keys = {"offload.optimizer": "cpu" if offload else "none", "train.precision": "bf16", "optim.lr": 3e-4,
            "optim.warmup_steps": 0, "monitor.enabled": False}
    if offload:
        keys["optim.state_dtype"] = args.state_dtype
    engine = tandem.Engine(model, keys,
                           run_dir="/tmp/tandem-python-bench")
    start_s = time.perf_counter() - t0

    def step(x, y):
        loss = ce(model, x, y)
        engine.backward(loss)
        engine.step()
        return loss.detach()

    torch.cuda.reset_peak_memory_stats(device)
    row = timed_loop(model, step, args, device, "tandem-python" + ("-offload" if offload else ""))
    row["engine_start_s"] = start_s
    row["split_k"] = engine.stats().get("split_k")
    engine.close()
    del engine, model
    return row


def torchao_offload(config_path, args, device):
    from torchao.optim import CPUOffloadOptimizer

    model = hf_model(config_path, args.checkpointing).to(device, torch.bfloat16)
    opt = CPUOffloadOptimizer(model.parameters(), torch.optim.AdamW, lr=3e-4, fused=True)

    def step(x, y):
        loss = ce(model, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    torch.cuda.reset_peak_memory_stats(device)
    return timed_loop(model, step, args, device, "torchao-cpu-offload")


def hf_bound(config_path, args, device):
    """The transformers model's own forward+backward on the GPU in bf16, no optimizer: the floor
    any optimizer placement can reach on this model."""
    model = hf_model(config_path, args.checkpointing).to(device, torch.bfloat16)

    def step(x, y):
        loss = ce(model, x, y)
        loss.backward()
        for p in model.parameters():
            p.grad = None
        return loss.detach()

    torch.cuda.reset_peak_memory_stats(device)
    row = timed_loop(model, step, args, device, "transformers-fwd-bwd-bound")
    del model
    return row


def deepspeed_offload(config_path, args):
    """DeepSpeed ZeRO-2 with offload_optimizer=cpu on the same architecture (bench/deepspeed_offload.py)."""
    here = os.path.dirname(os.path.abspath(__file__))
    out = f"/tmp/python-bench-{args.preset}-deepspeed.jsonl"
    if os.path.exists(out):
        os.remove(out)
    cmd = [sys.executable, os.path.join(here, "deepspeed_offload.py"), "--model-config", config_path, "--batch",
           str(args.batch), "--seq", str(args.seq), "--steps", str(args.warmup + args.steps), "--warmup",
           str(args.warmup), "--json", out] + (["--checkpointing"] if args.checkpointing else [])
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.peer_timeout)
    except subprocess.TimeoutExpired:
        return {"impl": "deepspeed-zero2-offload", "preset": args.preset, "error": f"no step in {args.peer_timeout} s"}
    if r.returncode != 0 or not os.path.exists(out):
        tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
        return {"impl": "deepspeed-zero2-offload", "preset": args.preset, "rc": r.returncode,
                "error": " | ".join(tail)[-600:]}
    row = json.loads(open(out).read().strip().splitlines()[-1])
    row["impl"] = "deepspeed-zero2-offload"
    return row


def emit(row, path):
    line = json.dumps(row)
    print(line, flush=True)
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


def guarded(fn, label, args):
    try:
        return fn()
    except Exception as e:  # a peer that fails at this size is a result, not a crash of the benchmark
        torch.cuda.empty_cache()
        return {"impl": label, "preset": args.preset, "error": one_line(e)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["resident", "offload"])
    ap.add_argument("--preset", default="1B")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2, help="resident: alternating rounds of each side")
    ap.add_argument("--checkpointing", action="store_true")
    ap.add_argument("--state-dtype", default="bf16")
    ap.add_argument("--peers", default="cli,bound,torchao",
                    help="offload: which peers run besides tandem.Engine (cli, bound, torchao, deepspeed)")
    ap.add_argument("--peer-timeout", type=int, default=300, help="seconds DeepSpeed may take")
    ap.add_argument("--cli", default="build/tandem")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    device = torch.device("cuda", 0)
    work = f"/tmp/python-bench-{args.preset}"
    # The architecture, as the CLI writes it: one short CLI run (also the CLI's figure in offload mode).
    extra = ["--set", "offload.optimizer=cpu", "--set", f"optim.state_dtype={args.state_dtype}"] if args.mode == "offload" else []
    cli_steps = args.warmup + args.steps if args.mode == "offload" and "cli" in args.peers else 2
    config_path = os.path.join(work + "-cli", "model_config.json")
    if "cli" in args.peers or not os.path.exists(config_path):  # else an earlier invocation's architecture
        summary, wall = cli_run(args, extra, work + "-cli", cli_steps)
    if args.mode == "offload" and "cli" in args.peers:
        emit({"impl": "tandem-cli-offload", "preset": args.preset, "batch": args.batch, "seq": args.seq,
              "step_s": summary.get("median_step_time_s"), "tokens_per_s": summary.get("median_tokens_per_s"),
              "wall_s": wall, "peak_gpu_bytes": summary.get("peak_device_bytes")}, args.json)
    if args.mode == "resident":
        for _ in range(args.rounds):
            emit(guarded(lambda: plain_pytorch(config_path, args, device), "pytorch-eager", args), args.json)
            torch.cuda.empty_cache()
            emit(guarded(lambda: tandem_engine(config_path, args, device, False), "tandem-python", args), args.json)
            torch.cuda.empty_cache()
        return
    if "nopython" not in args.peers:
        emit(guarded(lambda: tandem_engine(config_path, args, device, True), "tandem-python-offload", args), args.json)
        torch.cuda.empty_cache()
    if "bound" in args.peers:
        emit(guarded(lambda: hf_bound(config_path, args, device), "transformers-fwd-bwd-bound", args), args.json)
        torch.cuda.empty_cache()
    if "deepspeed" in args.peers:
        emit(deepspeed_offload(config_path, args), args.json)
    if "torchao" in args.peers:
        emit(guarded(lambda: torchao_offload(config_path, args, device), "torchao-cpu-offload", args), args.json)


if __name__ == "__main__":
    main()
