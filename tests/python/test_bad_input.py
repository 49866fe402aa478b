"""Bad input to the `tandem` package: one-line ValueError/TypeError naming the cause and the fix."""

import pytest
import torch
from torch import nn

import tandem
from models import engine_config, tiny_gpt, tiny_llama


class NoLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x):
        return self.b(self.a(x))


def one_line(e):
    text = str(e.value)
    assert "\n" not in text and "Exception raised from" not in text, text
    return text


def test_model_without_repeated_layers_is_one_block():
    model = NoLayers()
    with tandem.Engine(model, engine_config(True)) as engine:
        engine.backward(model(torch.ones(2, 4)).pow(2).mean())
        assert engine.step().step == 1


def test_named_layer_without_trainable_parameters():
    model = NoLayers()
    model.a.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters") as e:
        tandem.Engine(model, engine_config(True), blocks=[model.a, model.b])
    assert "leave it out" in one_line(e)


def test_a_closed_engine_says_so():
    model = tiny_gpt()
    engine = tandem.Engine(model, engine_config(True))
    engine.close()
    with pytest.raises(ValueError, match="engine is closed") as e:
        engine.step()
    one_line(e)


def test_a_key_that_does_nothing_on_the_cpu_warns():
    with pytest.warns(UserWarning, match="offload.pin_memory does nothing with the CPU"):
        tandem.Engine(tiny_gpt(), engine_config(True, **{"offload.pin_memory": False})).close()


def test_parameter_in_two_blocks():
    model = tiny_llama()
    layers = list(model.model.layers)
    with pytest.raises(ValueError, match="in two Blocks") as e:
        tandem.Engine(model, engine_config(True), blocks=layers + [layers[0].mlp])
    one_line(e)


def test_parameter_in_no_block():
    model = tiny_llama()
    with pytest.raises(ValueError, match="is in no Block") as e:
        tandem.Engine(model, engine_config(True), blocks=list(model.model.layers), edge_blocks=False)
    assert "model.embed_tokens.weight" in one_line(e)


def test_wrong_config_key():
    with pytest.raises(ValueError, match="optim.lrr") as e:
        tandem.Engine(tiny_gpt(), engine_config(True, **{"optim.lrr": 1e-3}))
    one_line(e)


def test_wrong_config_value_and_type():
    with pytest.raises(ValueError, match="offload.optimizer") as e:
        tandem.Engine(tiny_gpt(), engine_config(True, **{"offload.optimizer": "gpu"}))
    one_line(e)
    with pytest.raises(TypeError, match="not a config value"):
        tandem.Engine(tiny_gpt(), engine_config(True, **{"optim.lr": object()}))
    with pytest.raises(ValueError, match="does not exist"):
        tandem.Engine(tiny_gpt(), "no/such/config.yaml")


def test_not_a_module_and_bad_blocks():
    with pytest.raises(TypeError, match="nn.Module"):
        tandem.Engine(object())
    with pytest.raises(TypeError, match="blocks\\[0\\]"):
        tandem.Engine(tiny_gpt(), engine_config(True), blocks=["layer"])


def test_bad_loss_and_step_order():
    model = tiny_gpt()
    with tandem.Engine(model, engine_config(True)) as engine:
        with pytest.raises(ValueError, match="without engine.backward"):
            engine.step()
        with pytest.raises(TypeError, match="loss tensor"):
            engine.backward(1.0)
        with pytest.raises(ValueError, match="does not require grad"):
            engine.backward(torch.tensor(1.0))


def test_host_too_small_for_the_masters():
    with pytest.raises(ValueError, match="cannot hold the masters and Adam states") as e:
        tandem.Engine(tiny_llama(), engine_config(True, **{"offload.host_memory_gib": 0.0005}))
    assert "optim.state_dtype=bf16" in one_line(e)
    assert "optim.master_dtype=bf16" in one_line(e)


def test_missing_checkpoint(tmp_path):
    with tandem.Engine(tiny_gpt(), engine_config(True)) as engine:
        with pytest.raises(ValueError, match="no complete checkpoint|not a directory") as e:
            engine.load(str(tmp_path))
        one_line(e)


def test_checkpoint_of_another_model(tmp_path):
    model = tiny_gpt()
    with tandem.Engine(model, engine_config(True)) as engine:
        path = engine.save(str(tmp_path))
    with tandem.Engine(tiny_llama(), engine_config(True)) as engine:
        with pytest.raises(ValueError, match="another model|another architecture") as e:
            engine.load(path)
        one_line(e)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cpu_batch_in_a_gpu_run():
    model = tiny_gpt()
    with tandem.Engine(model, engine_config(True, **{"train.device": "cuda"})) as engine:
        with pytest.raises(TypeError, match="move the batch"):
            model(torch.zeros(2, 8, dtype=torch.long))


def test_a_device_that_is_not_one_is_named():
    with pytest.raises(ValueError, match="train.device 'gpu' is not a device; give auto, cpu, cuda or cuda:N"):
        tandem.Engine(tiny_gpt(), engine_config(True, **{"train.device": "gpu"}))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="train.device=cuda:0 but no CUDA device is visible"):
            tandem.Engine(tiny_gpt(), engine_config(True, **{"train.device": "cuda:0"}))
