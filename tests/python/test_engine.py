"""tandem.Engine against a plain PyTorch AdamW loop (CPU, fp32): both engines, accumulation, checkpoints, config files."""

import pytest
import torch

import tandem
from models import (CLIP, assert_close, engine_config, engine_losses, loss_of, batch, reference_losses, tiny_gpt,
                    tiny_llama)

STEPS = 30


@pytest.mark.parametrize("offload", [True, False], ids=["offload", "resident"])
@pytest.mark.parametrize("build", [tiny_llama, tiny_gpt], ids=["llama", "nanogpt"])
def test_engine_equals_plain_adamw(build, offload):
    ref, ref_norms = reference_losses(build(), STEPS)
    model = build()
    with tandem.Engine(model, engine_config(offload), run_dir=None) as engine:
        ours, norms = engine_losses(model, engine, STEPS)
    assert sum(n > CLIP for n in ref_norms) >= 5, "clipping must be active in this test"
    assert_close(ours, ref, 1e-5)
    assert_close(norms, ref_norms, 1e-4)


@pytest.mark.parametrize("offload", [True, False], ids=["offload", "resident"])
def test_save_load_continue_is_bitwise(tmp_path, offload):
    model = tiny_llama()
    with tandem.Engine(model, engine_config(offload)) as engine:
        whole, _ = engine_losses(model, engine, 8)
    model = tiny_llama()
    with tandem.Engine(model, engine_config(offload)) as engine:
        first, _ = engine_losses(model, engine, 4)
        path = engine.save(str(tmp_path / "run"))
    assert path.endswith("checkpoints/step_00000004")
    torch.manual_seed(123)  # a different start: everything must come from the checkpoint
    model = tiny_llama()
    with tandem.Engine(model, engine_config(offload)) as engine:
        assert engine.load(str(tmp_path / "run")) == path
        assert engine.global_step == 4
        rest, _ = engine_losses(model, engine, 4, first=4)
    assert first + rest == whole


def test_checkpoint_is_a_transformers_folder(tmp_path):
    import transformers

    model = tiny_llama()
    with tandem.Engine(model, engine_config(True)) as engine:
        engine_losses(model, engine, 3)
        path = engine.save(str(tmp_path))
        engine.wait()
    loaded = transformers.LlamaForCausalLM.from_pretrained(path)
    x, _ = batch(0)
    with torch.no_grad():
        model.eval()
        want = model(x).logits
        got = loaded(x).logits
    assert torch.equal(want, got)


def test_gradient_accumulation_equals_one_big_batch():
    model = tiny_gpt()
    with tandem.Engine(model, engine_config(True)) as engine:
        big, _ = engine_losses(model, engine, 5)
    model = tiny_gpt()
    acc = []
    with tandem.Engine(model, engine_config(True, **{"train.grad_accum": 2})) as engine:
        for s in range(5):
            x, y = batch(s)
            total = 0.0
            for half in (slice(0, 2), slice(2, 4)):
                loss = loss_of(model, x[half], y[half])
                engine.backward(loss)
                info = engine.step()
                total += loss.item() / 2
            assert info is not None and info.step == s + 1
            acc.append(total)
    assert_close(acc, big, 1e-5)


def test_evaluation_under_no_grad_does_not_open_a_step():
    model = tiny_gpt()
    with tandem.Engine(model, engine_config(True)) as engine:
        engine_losses(model, engine, 2)
        with torch.no_grad():
            loss_of(model, *batch(99))
        with pytest.raises(ValueError, match="without engine.backward"):
            engine.step()
        engine_losses(model, engine, 1, first=2)
        assert engine.global_step == 3


def test_config_from_a_deepspeed_json_and_a_yaml_file(tmp_path):
    """A DeepSpeed JSON and a YAML of tandem's keys configure the engine as the same dict would."""
    import json

    ds = tmp_path / "ds_config.json"
    ds.write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 4, "gradient_clipping": CLIP,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                                                   "weight_decay": 0.1}},
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
    }))
    yaml = tmp_path / "tandem.yaml"
    yaml.write_text("train:\n  device: cpu\n  precision: fp32\noptim:\n  schedule: constant\n  warmup_steps: 0\n")
    model = tiny_llama()
    with tandem.Engine(model, [str(ds), str(yaml)]) as engine:
        assert engine.stats()["offload"]
        ours, _ = engine_losses(model, engine, 5)
    ref, _ = reference_losses(tiny_llama(), 5)
    assert_close(ours, ref, 1e-5)


def test_recipe_follows_the_module_size():
    """With no optim keys the engine takes the recipe row of the module's size (docs/recipes.md);
    a key the config sets wins over it."""
    import yaml

    def resolved_lr(config):
        with tandem.Engine(tiny_llama(), config, run_dir=None) as engine:
            return yaml.safe_load(engine.config_yaml())["optim"]["lr"]

    config = {"train.device": "cpu", "train.precision": "fp32", "offload.optimizer": "cpu"}
    # The tiny Llama is far below 95M parameters: Pythia-70M's row, lr 1e-3 (the generic row is 3e-4).
    assert resolved_lr(config) == pytest.approx(1e-3)
    assert resolved_lr(dict(config, **{"optim.lr": 5e-4})) == pytest.approx(5e-4)


class BatchNormNet(torch.nn.Module):
    """Layers with BatchNorm: running statistics are state the optimizer does not hold."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh()) for _ in range(3))
        self.out = torch.nn.Linear(8, 1)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.out(x)


def test_save_load_restores_the_module_buffers(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(16, 8) * 3 + 1
    model = BatchNormNet()
    with tandem.Engine(model, engine_config(True)) as engine:
        for _ in range(3):
            engine.backward(model(x).pow(2).mean())
            engine.step()
        engine.save(str(tmp_path / "run"))
        model.eval()
        want = model(x).detach()
        stats = model.layers[1][1].running_var.clone()
    assert not torch.allclose(stats, torch.ones(8))  # they moved
    torch.manual_seed(1)
    fresh = BatchNormNet()
    with tandem.Engine(fresh, engine_config(True)) as engine:
        engine.load(str(tmp_path / "run"))
        fresh.eval()
        assert torch.equal(fresh.layers[1][1].running_var, stats)
        assert torch.equal(fresh.layers[2][1].num_batches_tracked, torch.tensor(3))
        assert torch.allclose(fresh(x), want, rtol=1e-6, atol=1e-7)
