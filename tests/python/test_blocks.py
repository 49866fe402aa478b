"""tandem.find_blocks: the Blocks of a transformers Llama and a nanoGPT, tied weights once."""

import tandem
from models import assert_close, engine_config, engine_losses, reference_losses, tiny_gpt, tiny_llama


def test_blocks_found_and_tied_weight_once():
    model = tiny_llama(tied=True)
    specs = tandem.find_blocks(model)
    assert [s.name for s in specs] == ["embed", "layer.0", "layer.1", "head"]
    names = [n for s in specs for n, _ in s.params]
    assert len(names) == len(set(names)) == len(list(model.parameters()))
    assert "lm_head.weight" not in names  # tied to model.embed_tokens.weight, which the embedding Block owns
    gpt = tandem.find_blocks(tiny_gpt())
    assert [s.name for s in gpt] == ["embed", "layer.0", "layer.1", "head"]
    assert [n for n, _ in gpt[-1].params] == ["transformer.ln_f.weight", "transformer.ln_f.bias"]


def test_tied_weights_train_as_plain_adamw():
    ref, _ = reference_losses(tiny_llama(tied=True), 10)
    model = tiny_llama(tied=True)
    with tandem.Engine(model, engine_config(True)) as engine:
        ours, _ = engine_losses(model, engine, 10)
    assert_close(ours, ref, 1e-5)
