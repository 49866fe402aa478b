#!/usr/bin/env python3
"""The peer for tandem's offload benchmark: the identical LLaMA-style model trained with DeepSpeed
ZeRO and the optimizer offloaded to the host CPU (DeepSpeedCPUAdam), reporting tokens/s; one GPU, or
several under a launcher (data parallel, see "Several GPUs" below).

The architecture comes from the model_config.json that `tandem train` writes into its run
directory; the model itself is bench/pytorch_llama.py's (imported, not copied), so the forward
pass and the loss are the same code as the plain-PyTorch peer.

Usage (one process, no launcher; distributed env vars are filled in for a world of one on loopback):
  python3 bench/deepspeed_offload.py --model-config RUN/model_config.json --batch 8 --seq 2048 \
      --steps 10 --warmup 3 --checkpointing --json OUT.jsonl
  python3 bench/deepspeed_offload.py --model-config RUN/model_config.json --ratio 0.5 ...   # partial

What runs:
  * The model is built in bf16 directly on the GPU (default dtype bf16 inside a torch.device("cuda")
    context), no fp32 copy anywhere on the GPU; DeepSpeed keeps the fp32 master weights, the fp32
    gradients and the Adam moments itself, on the host when offloaded.
  * DeepSpeed config: micro batch = --batch, gradient accumulation 1, bf16, gradient clipping 1.0,
    AdamW (lr --lr, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on matrices and the embedding, 0 on
    the norm weights, as in pytorch_llama.py), zero_optimization with offload_optimizer
    {device: cpu, pin_memory: true}, overlap_comm, contiguous_gradients, 5e8-element buckets.
  * --ratio 1.0 (default): ZeRO stage 2, everything offloaded; impl "deepspeed_zero2_offload".
  * --ratio < 1.0: DeepSpeed's partial offload (ZeRO-Offload++, offload_optimizer.ratio). In
    DeepSpeed 0.19.x this is ZeRO stage 3 only: DeepSpeedZeroConfig.offload_ratio_check asserts
    "Partial offloading only supported for ZeRO Stage 3.", and only stage3.py reads the ratio
    (engine.zero_partial_offload() is passed to DeepSpeedZeroOptimizer_Stage3 alone; stage_1_and_2.py
    never looks at it). So ratio < 1 runs use stage 3; impl "deepspeed_zero3_offload_ratio", "stage": 3.
    Stage 3 splits the parameters into sub-groups of --sub-group-size elements (default 1e8 here;
    DeepSpeed's own default of 1e9 gives a 7B model only ~7 sub-groups) and updates the first
    int((1 - ratio) * n_subgroups) of them on the GPU with torch.optim.AdamW (fp32 master, moments
    and gradient on the GPU), the rest on the CPU. The fraction of parameters actually updated on the
    GPU is reported as gpu_update_fraction. --stage 3 with --ratio 1.0 gives the stage-3 baseline
    (same overheads, nothing on the GPU), to separate the cost of stage 3 from the gain of the split.
  * --checkpointing wraps every decoder layer: torch.utils.checkpoint.checkpoint(layer, x, cos, sin,
    use_reentrant=False), done by replacing model.layers with thin wrappers, so Model.forward (which
    calls `layer(x, cos, sin)` for each layer) is unchanged.
  * Data: random token ids (torch.randint over the vocab on the GPU, generator seeded 0), a fresh
    (batch, seq+1) draw per step, inputs x[:, :-1], targets x[:, 1:]; the loss is Model.forward's.
  * Step: loss = engine(x, y); engine.backward(loss); engine.step(); torch.cuda.synchronize(); timed
    with time.perf_counter. --steps is the total number of steps; the first --warmup are dropped.

Several GPUs: started by torchrun (`python3 -m torch.distributed.run --nnodes 1 --nproc-per-node N
--master-addr 127.0.0.1 --master-port P bench/deepspeed_offload.py ...`) or by DeepSpeed's own
launcher (`deepspeed --num_gpus N --master_port P bench/deepspeed_offload.py ...`; the --local_rank
it appends is accepted and ignored, LOCAL_RANK comes from the environment as under torchrun). Each
rank trains on cuda:LOCAL_RANK with --batch rows (train_micro_batch_size_per_gpu: weak scaling) of
its own random tokens (generator seeded with its rank); ZeRO-2 partitions the fp32 master weights,
gradients and Adam moments over the ranks (each rank's 1/N in its own pinned host memory) and
all-gathers the bf16 weights after the step. Rank 0 alone prints the step lines and the JSON line,
with world_size added, tokens_per_s and model_tflops counting every rank's tokens (global), the
step times rank 0's (the collectives keep the ranks in step), peak_gpu_bytes / peak_host_bytes rank
0's and peak_gpu_bytes_max_rank / peak_host_bytes_all_ranks over all ranks. A failure on any rank
writes its own JSON line with "error" and "rank" and exits with status 1 (not 0, so the launcher
stops the other ranks instead of leaving them waiting in a collective). Set OMP_NUM_THREADS per rank
(e.g. cores / N): torchrun sets it to 1 when it is unset, which would leave CPU Adam one thread.

Output: one human line per step, then one JSON line (printed, and appended to --json) with impl,
ratio, stage, batch, seq, steps, median_step_s, tokens_per_s = batch*seq*world/median, model_tflops =
6*N*tokens_per_s/1e12, peak_gpu_bytes (torch.cuda.max_memory_allocated over the training steps; the
peak during deepspeed.initialize is peak_gpu_init_bytes), peak_host_bytes (ru_maxrss*1024 of this
process; pinned host buffers count), loss_first, loss_last, deepspeed_version, and a few more.
N = all parameters minus the vocab padding rows (pytorch_llama.py pads the vocab to a multiple of 64
and counts parameters the same way; it has no embedding-excluding helper), i.e. the embedding and
lm_head ARE counted; tflops_with_attention adds pytorch_llama.py's 12*L*d*seq*tokens attention term.
Any failure (DeepSpeed import, cpu_adam build, config rejected, CUDA OOM, ...) prints one line
"deepspeed_offload: ERROR ..." and writes a JSON line with "error"; the exit status is 0 either way,
so a benchmark script calling this carries on. (A host out-of-memory kill cannot be caught.)

Device environment (Ubuntu 24.04 host, Python 3.12, torch 2.11, one H100 80GB, 16 cores, 128 GiB,
no network). DeepSpeed 0.19.x and its missing dependencies come as wheels in .whl, built with
DS_BUILD_OPS=0, so the cpu_adam op is JIT-compiled on first use (about a minute):
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
The JIT build needs `ninja` on PATH, g++ and Python.h; it is plain C++ (g++ -O3 -march=native
-fopenmp), no nvcc: the CUDA accelerator takes CPUAdamBuilder from the CPU op builders. Built ops go
to TORCH_EXTENSIONS_DIR (default ~/.cache/torch_extensions) and are reused. DS_ACCELERATOR is left
alone (cuda). Nothing else is compiled: the stage-3 GPU part of a partial offload uses torch's AdamW.
The process group is NCCL with a world of one: MASTER_ADDR=127.0.0.1, MASTER_PORT a free local port,
RANK=LOCAL_RANK=0, WORLD_SIZE=1 and NCCL_SOCKET_IFNAME=lo, each only if not already set.
Host memory: the offloaded state is about 16 bytes per parameter (fp32 master, fp32 gradient, two
fp32 moments), pinned, so a 7B model needs over 100 GiB of the 128 GiB host; CPU Adam threads
follow OMP_NUM_THREADS (default: all cores).
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

from bench_util import free_port, one_line

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

STAGE2_IMPL, STAGE3_IMPL = "deepspeed_zero2_offload", "deepspeed_zero3_offload_ratio"


def setup_dist_env():
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        try:
            os.environ["MASTER_PORT"] = str(free_port())
        except OSError:
            os.environ["MASTER_PORT"] = "29511"
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")


def ds_config(a, stage):
    off = {"device": "cpu", "pin_memory": True}
    if a.ratio < 1.0:
        off["ratio"] = a.ratio
    zero = {
        "stage": stage,
        "offload_optimizer": off,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": int(5e8),
    }
    if stage == 2:
        zero["allgather_bucket_size"] = int(5e8)
        zero["reduce_scatter"] = True
    else:
        zero["sub_group_size"] = int(a.sub_group_size)
    return {
        "train_micro_batch_size_per_gpu": a.batch,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "gradient_clipping": 1.0,
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": a.lr, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1},
        },
        "zero_optimization": zero,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }


def build_model(torch, pytorch_llama, c, checkpointing):
    """bf16 parameters created directly on the GPU: one copy, no fp32 detour."""
    import torch.nn as nn
    from torch.utils.checkpoint import checkpoint

    class Checkpointed(nn.Module):
        def __init__(self, layer):
            super().__init__()
            self.layer = layer

        def forward(self, x, cos, sin):
            return checkpoint(self.layer, x, cos, sin, use_reentrant=False)

    old = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.bfloat16)
        bf16_default = True
    except (TypeError, RuntimeError):  # a torch that refuses a bf16 default: build fp32, cast per module
        bf16_default = False
    try:
        with torch.device("cuda"):
            m = pytorch_llama.Model(c)
    finally:
        torch.set_default_dtype(old)
    if not bf16_default:
        for mod in m.modules():  # per module, so the fp32 copy of only one module is live at a time
            for name, p in list(mod.named_parameters(recurse=False)):
                setattr(mod, name, nn.Parameter(p.detach().to(torch.bfloat16)))
    if checkpointing:
        m.layers = nn.ModuleList(Checkpointed(l) for l in m.layers)
    return m


def gpu_update_fraction(engine, stage, ratio):
    """Fraction of parameter elements whose optimizer step runs on the GPU (stage 3 split)."""
    if stage != 3:
        return 0.0
    try:
        opt = engine.optimizer
        numel = [int(n) for n in opt.fp16_partitioned_groups_flat_numel]
        on_gpu = sum(n for i, n in enumerate(numel) if opt.subgroup_to_device[i] != "cpu")
        return on_gpu / max(sum(numel), 1)
    except Exception:
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-config", required=True, help="model_config.json from a tandem run directory")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=10, help="total steps, warmup included")
    ap.add_argument("--warmup", type=int, default=3, help="first steps left out of the timing")
    ap.add_argument("--checkpointing", action="store_true", help="activation checkpointing per decoder layer")
    ap.add_argument("--ratio", type=float, default=1.0,
                    help="offload_optimizer.ratio: share of the optimizer on the CPU (< 1 needs ZeRO stage 3)")
    ap.add_argument("--stage", default="auto", choices=["auto", "2", "3"],
                    help="ZeRO stage; auto = 2 for --ratio 1.0, else 3")
    ap.add_argument("--sub-group-size", type=float, default=1e8,
                    help="stage 3 only: elements per optimizer sub-group (the granularity of --ratio)")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--json", default="", help="JSON-lines output file (appended)")
    ap.add_argument("--local_rank", "--local-rank", type=int, default=None,
                    help=argparse.SUPPRESS)  # appended by the deepspeed launcher; LOCAL_RANK is in the environment
    a = ap.parse_args()

    stage = (2 if a.ratio >= 1.0 else 3) if a.stage == "auto" else int(a.stage)
    rec = {"impl": STAGE2_IMPL if stage == 2 else STAGE3_IMPL, "ratio": a.ratio, "stage": stage,
           "batch": a.batch, "seq": a.seq, "steps": a.steps, "warmup": a.warmup,
           "checkpointing": a.checkpointing, "model_config": a.model_config}

    # Under a launcher: this process's rank in a world of several (a world of one is the plain run).
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        rec["world_size"] = world

    def say(text):
        if rank == 0:
            print(text, flush=True)

    def finish(status=0, write=True):
        if write:
            line = json.dumps(rec)
            print(line, flush=True)
            if a.json:
                with open(a.json, "a") as f:
                    f.write(line + "\n")
        sys.stdout.flush()
        sys.stderr.flush()
        # Skip interpreter teardown: freeing ~100 GiB of pinned memory and the NCCL communicator can
        # take long or hang after a failure; everything worth keeping is written.
        os._exit(status)

    def fail(what, exc=None):
        msg = what + (f": {one_line(exc)}" if exc is not None else "")
        rec["error"] = msg
        if world > 1:
            rec["rank"] = rank
        print(f"deepspeed_offload: ERROR{f' (rank {rank})' if world > 1 else ''} {msg}", flush=True)
        # One process: status 0, so a benchmark script carries on. Several: 1, so the launcher stops
        # the other ranks, which would otherwise wait in their next collective.
        finish(1 if world > 1 else 0)

    if not 0.0 <= a.ratio <= 1.0:
        fail(f"--ratio must be in [0, 1], got {a.ratio}")
    if a.steps <= a.warmup:
        fail(f"--steps ({a.steps}) must exceed --warmup ({a.warmup})")
    if stage == 2 and a.ratio < 1.0:
        # DeepSpeed would reject this in DeepSpeedZeroConfig.offload_ratio_check; say it plainly.
        fail("offload_optimizer.ratio < 1 is only supported with ZeRO stage 3 (DeepSpeed's "
             "offload_ratio_check: 'Partial offloading only supported for ZeRO Stage 3.')")

    try:
        c = json.load(open(a.model_config))
    except Exception as e:
        fail(f"cannot read {a.model_config}", e)

    setup_dist_env()
    try:
        import torch
        import pytorch_llama
    except Exception as e:
        fail("torch import failed", e)
    rec["torch"] = torch.__version__
    try:
        import deepspeed
        rec["deepspeed_version"] = deepspeed.__version__
    except Exception as e:
        fail("deepspeed import failed", e)

    try:
        if not torch.cuda.is_available():
            fail("no CUDA device")
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        rec["gpu"] = torch.cuda.get_device_name()
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.manual_seed(0)
        deepspeed.init_distributed(dist_backend="nccl")
    except Exception as e:
        fail("distributed init failed", e)

    try:
        from deepspeed.ops.op_builder import CPUAdamBuilder
        t0 = time.perf_counter()
        CPUAdamBuilder().load(verbose=False)  # JIT build or cache hit, ahead of initialize for a clear error
        say(f"deepspeed {deepspeed.__version__}: cpu_adam op loaded in {time.perf_counter() - t0:.1f} s")
    except Exception as e:
        fail("deepspeed cpu_adam op failed to build/load", e)

    try:
        m = build_model(torch, pytorch_llama, c, a.checkpointing)
        d = c["hidden_size"]
        n_all = sum(p.numel() for p in m.parameters())
        n_params = n_all - (m.padded - m.vocab) * d * (1 if m.tied else 2)
        rec["params"] = n_params
        rec["params_counted"] = "all_minus_vocab_padding"
        if stage == 3:
            # Model.forward uses the output weight through F.linear outside its owning module's
            # forward; ZeRO-3 must be told to gather it for the root module.
            deepspeed.zero.register_external_parameter(m, m.embed.weight if m.tied else m.lm_head.weight)
        decay = [p for p in m.parameters() if p.dim() >= 2]
        no_decay = [p for p in m.parameters() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    except Exception as e:
        fail("model build failed", e)

    cfg = ds_config(a, stage)
    try:
        engine, _, _, _ = deepspeed.initialize(model=m, model_parameters=groups, config=cfg)
    except Exception as e:
        fail(f"deepspeed.initialize rejected the config or failed (stage {stage}, ratio {a.ratio})", e)
    del m, groups, decay, no_decay
    rec["gpu_update_fraction"] = gpu_update_fraction(engine, stage, a.ratio)
    rec["peak_gpu_init_bytes"] = torch.cuda.max_memory_allocated()
    rec["omp_num_threads"] = os.environ.get("OMP_NUM_THREADS", "")
    say(f"{rec['impl']}: {n_params / 1e9:.3f} B params, stage {stage}, ratio {a.ratio}, "
        f"gpu_update_fraction {rec['gpu_update_fraction']}, batch {a.batch}{' per rank' if world > 1 else ''}, "
        f"seq {a.seq}, checkpointing {a.checkpointing}{f', {world} ranks' if world > 1 else ''}")

    vocab = c["vocab_size"]
    gen = torch.Generator(device="cuda")
    gen.manual_seed(rank)  # each rank its own tokens; rank 0 (and a world of one) seed 0
    tokens = a.batch * a.seq * world  # every rank's: global tokens per step
    times, losses = [], []
    try:
        engine.train()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        for step in range(a.steps):
            t0 = time.perf_counter()
            x = torch.randint(0, vocab, (a.batch, a.seq + 1), device="cuda", generator=gen)
            loss = engine(x[:, :-1], x[:, 1:])
            engine.backward(loss)
            engine.step()
            torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            times.append(dt)
            losses.append(loss.item())
            say(f"step {step:3d}  loss {losses[-1]:.4f}  {dt * 1e3:9.1f} ms  {tokens / dt:10.0f} tok/s"
                f"{'  (warmup)' if step < a.warmup else ''}")
    except Exception as e:
        rec["steps_done"] = len(times)
        if losses:
            rec["loss_first"] = losses[0]
            rec["loss_last"] = losses[-1]
        try:
            rec["peak_gpu_bytes"] = torch.cuda.max_memory_allocated()
        except Exception:
            pass
        rec["peak_host_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        oom = isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower()
        fail(f"training step {len(times)} failed{' (CUDA out of memory)' if oom else ''}", e)

    steady = times[a.warmup:]
    med = statistics.median(steady)
    L = c["num_hidden_layers"]
    rec.update({
        "median_step_s": med,
        "min_step_s": min(steady),
        "max_step_s": max(steady),
        "tokens_per_s": tokens / med,
        "model_tflops": 6 * n_params * tokens / med / 1e12,
        "tflops_with_attention": (6 * n_params * tokens + 12 * L * d * a.seq * tokens) / med / 1e12,
        "peak_gpu_bytes": torch.cuda.max_memory_allocated(),
        "peak_host_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "step_times_s": times,
        "tokens_per_step": tokens,
    })
    if world > 1:
        # Every rank's peaks, after the timed steps: the largest GPU peak and the host total.
        try:
            import torch.distributed as dist
            gpu = torch.tensor([float(rec["peak_gpu_bytes"])], dtype=torch.float64, device="cuda")
            host = torch.tensor([float(rec["peak_host_bytes"])], dtype=torch.float64, device="cuda")
            dist.all_reduce(gpu, op=dist.ReduceOp.MAX)
            dist.all_reduce(host, op=dist.ReduceOp.SUM)
            rec["peak_gpu_bytes_max_rank"] = int(gpu.item())
            rec["peak_host_bytes_all_ranks"] = int(host.item())
        except Exception as e:
            rec["peak_gather_error"] = one_line(e)
    ranks = ""
    if world > 1:
        ranks = f" ({world} ranks, host {rec.get('peak_host_bytes_all_ranks', 0) / 2**30:.2f} GiB over all)"
    say(f"{rec['impl']}: median {med * 1e3:.1f} ms/step, {rec['tokens_per_s']:.0f} tok/s, "
        f"{rec['model_tflops']:.1f} model TFLOP/s, peak GPU {rec['peak_gpu_bytes'] / 2**30:.2f} GiB, "
        f"peak host {rec['peak_host_bytes'] / 2**30:.2f} GiB, loss {losses[0]:.4f} -> {losses[-1]:.4f}{ranks}")
    finish(write=rank == 0)


if __name__ == "__main__":
    main()
