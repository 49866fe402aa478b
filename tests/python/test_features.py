"""What the CLI's engine does, through tandem.Engine: telemetry, the trace, placement on the CPU,
the delayed update, fp16 loss scaling, the host ring, the update split."""

import json
import os
import socket
import urllib.request

import pytest
import torch

import tandem
from models import assert_close, batch, engine_config, engine_losses, loss_of, tiny_gpt, tiny_llama


def rows(run_dir):
    return [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_metrics_rows_and_trace(tmp_path):
    model = tiny_llama()
    cfg = engine_config(True, **{"monitor.enabled": True, "monitor.period_s": 0.05, "offload.trace_steps": "2"})
    with tandem.Engine(model, cfg, run_dir=str(tmp_path)) as engine:
        losses, _ = engine_losses(model, engine, 4)
    r = rows(tmp_path)
    assert [x["step"] for x in r] == [1, 2, 3, 4]
    assert [x["loss"] for x in r] == pytest.approx(losses)
    for key in ("lr", "grad_norm", "step_time_s", "tokens_per_s", "time_cpu_update_s", "offload_gpu_blocks",
                "offload_speculative_steps", "mem_host_peak_bytes"):
        assert key in r[-1], key
    assert r[-1]["tokens"] == 4 * 4 * 16
    names = {e.get("name") for e in json.load(open(tmp_path / "trace.json"))["traceEvents"]}
    assert {"forward layer.0", "backward layer.1", "forward+loss+backward head"} <= names, names
    # Closing the engine writes summary.json, as the CLI's run does.
    summary = json.load(open(tmp_path / "summary.json"))
    assert summary["steps"] == 4 and summary["final_step"] == 4
    assert summary["final_loss"] == pytest.approx(losses[-1])
    assert summary["tokens_per_step"] == 4 * 16 and summary["median_tokens_per_s"] > 0
    assert summary["params"] == sum(p.numel() for p in model.parameters())
    assert summary["telemetry"]["samples"] > 0


def test_prometheus_endpoint_serves_the_run(tmp_path):
    port = free_port()
    model = tiny_gpt()
    cfg = engine_config(True, **{"monitor.metrics_port": port, "offload.trace_steps": "2"})
    with tandem.Engine(model, cfg, run_dir=str(tmp_path / "run")) as engine:
        losses, _ = engine_losses(model, engine, 2)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert 'tandem_steps_total{run="run"} 2' in text, text[:800]
    assert f'tandem_loss{{run="run"}} {losses[-1]:.6g}'[:28] in text, text[:800]
    assert os.path.exists(tmp_path / "run" / "trace.json")  # the last step traced, written at close()


def test_layers_placed_on_the_cpu_train_as_on_the_device():
    ref_model = tiny_llama()
    with tandem.Engine(ref_model, engine_config(True)) as engine:
        ref, _ = engine_losses(ref_model, engine, 6)
    model = tiny_llama()
    cfg = engine_config(True, **{"placement.policy": "static", "placement.blocks": "cpu"})
    with tandem.Engine(model, cfg) as engine:
        ours, _ = engine_losses(model, engine, 6)
        assert engine.stats()["offload"]
    assert_close(ours, ref, 1e-6)


def test_delayed_update_lags_one_step():
    """offload.delayed_update: each step's forward sees the weights of two updates ago, as a
    one-step-lagged AdamW; the first two steps see the initial weights."""
    model = tiny_gpt()
    # Every Block CPU-updated (k = 0): the delay applies to CPU-updated Blocks only.
    cpu_side = {"offload.update_split": 0, "offload.speculate": "never"}
    with tandem.Engine(model, engine_config(True, **cpu_side, **{"offload.delayed_update": True})) as engine:
        delayed, _ = engine_losses(model, engine, 5)
        assert engine.stats()["gpu_blocks"] == 0
    model = tiny_gpt()
    with tandem.Engine(model, engine_config(True, **cpu_side)) as engine:
        exact, _ = engine_losses(model, engine, 5)
    assert delayed[0] == exact[0]
    assert all(d != e for d, e in zip(delayed[1:], exact[1:]))


def test_host_ring_and_bf16_states_and_fixed_split():
    ref_model = tiny_llama()
    with tandem.Engine(ref_model, engine_config(True, **{"offload.speculate": "never"})) as engine:
        ref, _ = engine_losses(ref_model, engine, 5)
    model = tiny_llama()
    cfg = engine_config(True, **{"offload.host_ring": 2, "offload.speculate": "never", "offload.update_split": 0.5})
    with tandem.Engine(model, cfg) as engine:
        ours, _ = engine_losses(model, engine, 5)
        assert engine.stats()["gpu_blocks"] == 2  # the embedding and the first of two layers
    assert_close(ours, ref, 1e-6)
    model = tiny_llama()
    with tandem.Engine(model, engine_config(True, **{"optim.state_dtype": "bf16"})) as engine:
        bf16, _ = engine_losses(model, engine, 5)
    assert_close(bf16, ref, 1e-2)


def test_host_ring_chosen_when_per_block_buffers_do_not_fit():
    # Every Block CPU-updated (k = 0): 90432 parameters need 1.8 MB for the masters, states and (the
    # CPU as the device) working weights and gradients, 3.6 MB with per-Block buffers and the undo
    # log, over 0.8 of 2.1 MB.
    model = tiny_llama()
    cfg = engine_config(True, **{"offload.host_memory_gib": 0.002, "offload.update_split": 0})
    with tandem.Engine(model, cfg) as engine:
        assert engine.stats()["gpu_blocks"] == 0
        assert engine.stats()["host_ring"] == 4
        engine_losses(model, engine, 2)
    with tandem.Engine(tiny_llama(), engine_config(True, **{"offload.update_split": 0})) as engine:
        assert engine.stats()["host_ring"] == 0
    # As the CLI's plan: no automatic ring for a delayed update that accumulates (the ring holds one
    # micro-batch's gradients).
    refusing = {"offload.delayed_update": True, "train.grad_accum": 2}
    cfg = engine_config(True, **{"offload.host_memory_gib": 0.002, "offload.update_split": 0}, **refusing)
    with tandem.Engine(tiny_llama(), cfg) as engine:
        assert engine.stats()["host_ring"] == 0
    # speculate=always takes the ring too: its speculative updates are solved back (Note [Retraction]).
    cfg = engine_config(True, **{"offload.host_memory_gib": 0.002, "offload.update_split": 0,
                                 "offload.speculate": "always"})
    model = tiny_llama()
    with tandem.Engine(model, cfg) as engine:
        assert engine.stats()["host_ring"] == 4
        engine_losses(model, engine, 3)
        assert engine.stats()["speculative_steps"] == 3


def test_host_ring_counts_only_the_cpu_updated_blocks():
    # k = 1: the embedding and both layers are updated on the device, the head (8256 parameters) on
    # the CPU. Its per-Block buffers fit 0.8 of 2.7 MB beside the device side's 1.7 MB; those of
    # every Block (3.6 MB) would not.
    model = tiny_llama()
    cfg = engine_config(True, **{"offload.host_memory_gib": 0.0025, "offload.update_split": 1})
    with tandem.Engine(model, cfg) as engine:
        assert engine.stats()["gpu_blocks"] == 3
        assert engine.stats()["host_ring"] == 0
        engine_losses(model, engine, 2)


def test_fp16_loss_scale_backs_off_and_skips():
    model = tiny_gpt()
    cfg = engine_config(True, **{"train.precision": "fp16", "scaler.init_scale": 2.0 ** 40})
    with tandem.Engine(model, cfg) as engine:
        infos = []
        for s in range(4):
            engine.backward(loss_of(model, *batch(s)))
            infos.append(engine.step())
    assert infos[0].skipped and infos[0].loss_scale < 2.0 ** 40
    assert infos[-1].loss_scale <= infos[0].loss_scale


def test_abandoned_step_can_be_retried():
    model = tiny_gpt()
    with tandem.Engine(model, engine_config(True)) as engine:
        ref_model = tiny_gpt()
        with tandem.Engine(ref_model, engine_config(True)) as ref_engine:
            ref, _ = engine_losses(ref_model, ref_engine, 3)
        x, y = batch(0)
        loss_of(model, x, y)  # a forward whose backward "ran out of memory"
        engine.abandon_step()
        ours, _ = engine_losses(model, engine, 3)
    assert ours == ref


def test_train_step_halves_the_micro_batch_on_out_of_memory():
    """Note [Adaptive micro-batch] through train_step: an out-of-memory error (injected here above
    two rows) gives the step up and runs it again in smaller parts; the losses are those of the
    whole batch, and the parts grow back after train.oom_grow_after clean steps."""
    ref_model = tiny_gpt()
    with tandem.Engine(ref_model, engine_config(True)) as engine:
        ref, _ = engine_losses(ref_model, engine, 5)
    model = tiny_gpt()
    sizes, limit = [], [2]

    def loss_fn(x, y):
        loss = loss_of(model, x, y)
        sizes.append(x.shape[0])
        if x.shape[0] > limit[0]:
            raise torch.OutOfMemoryError("injected: CUDA out of memory")
        return loss

    with tandem.Engine(model, engine_config(True, **{"train.oom_grow_after": 2})) as engine:
        for s in range(5):
            if s == 2:
                limit[0] = 4  # memory enough again: the parts may grow back
            engine.train_step(loss_fn, *batch(s))
        assert engine.oom_retries == 1
        run_dir = engine.run_dir
    assert sizes[:3] == [4, 2, 2]  # the whole batch, then halves
    assert 4 in sizes[3:]  # grown back after two clean steps
    written = rows(run_dir)
    assert [r["micro_batch_effective"] for r in written if "oom" in r] == [2]  # the retry's row, as the CLI's
    assert [r.get("micro_batch_effective") for r in written if "loss" in r][:3] == [2, 2, None]  # grown back
    assert_close([r["loss"] for r in written if "loss" in r], ref, 1e-6)


def test_default_run_directories_do_not_collide():
    with tandem.Engine(tiny_gpt(), engine_config(True)) as a, tandem.Engine(tiny_gpt(), engine_config(True)) as b:
        assert a.run_dir != b.run_dir and a.run_dir.startswith("runs/")


def test_train_step_gives_up_at_one_row():
    model = tiny_gpt()

    def loss_fn(x, y):
        loss_of(model, x, y)
        raise torch.OutOfMemoryError("injected")

    with tandem.Engine(model, engine_config(True)) as engine:
        with pytest.raises(ValueError, match="even at micro-batch 1"):
            engine.train_step(loss_fn, *batch(0))
        engine_losses(model, engine, 1)  # the engine goes on


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_layers_on_the_cpu_beside_the_gpu(precision):
    """On a GPU run, layers placed on the CPU compute there with the host copies; their inputs and
    outputs cross inside autograd. fp32: the losses of the all-GPU run; bf16: close to them."""
    def run(extra):
        model = tiny_llama()
        cfg = engine_config(True, **{"train.device": "cuda", "train.precision": precision, **extra})
        with tandem.Engine(model, cfg) as engine:
            out = []
            for s in range(6):
                x, y = batch(s)
                loss = loss_of(model, x.cuda(), y.cuda())
                engine.backward(loss)
                engine.step()
                out.append(loss.item())
            return out, engine.stats()

    gpu, _ = run({"offload.update_split": 0})
    mixed, stats = run({"offload.update_split": 0, "placement.policy": "static", "placement.blocks": "cpu"})
    assert_close(mixed, gpu, 1e-4 if precision == "fp32" else 2e-2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_offload_bf16_trains_like_the_resident_engine():
    def run(offload):
        model = tiny_llama()
        cfg = engine_config(offload, **{"train.device": "cuda", "train.precision": "bf16"})
        with tandem.Engine(model, cfg) as engine:
            out = []
            for s in range(8):
                x, y = batch(s)
                engine.backward(loss_of(model, x.cuda(), y.cuda()))
                out.append(engine.step().grad_norm)
            return out, [p.dtype for p in model.parameters()]

    resident, dtypes_r = run(False)
    offload, dtypes_o = run(True)
    assert set(dtypes_r) == {torch.float32} and set(dtypes_o) == {torch.bfloat16}
    assert_close(offload, resident, 5e-2)
