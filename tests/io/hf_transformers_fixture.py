#!/usr/bin/env python3
"""Reference outputs from transformers for tests/io/hf_transformers_test.cpp.

  write OUT_DIR      Builds tiny LlamaForCausalLM models, saves each with save_pretrained (the
                     transformers 5.x config.json layout) and as a copy whose config.json is
                     rewritten in the transformers 4.x layout (top-level rope_theta and
                     rope_scaling, torch_dtype), and writes OUT_DIR/reference.safetensors: the
                     input ids and transformers' fp32 logits for them.
  forward MODEL_DIR OUT_FILE
                     Loads MODEL_DIR (e.g. one tandem wrote) with transformers and writes the
                     input ids and its fp32 logits to OUT_FILE.

Both files carry MAGIC and VERSION in their safetensors metadata; the test checks them.
"""

import json
import os
import shutil
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local; never reach for the hub

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

transformers.utils.logging.disable_progress_bar()

MAGIC = "tandem-hf-reference"
VERSION = "1"
BATCH, SEQ = 2, 48

# name -> LlamaConfig arguments (transformers 5.x names). Sizes deliberately not multiples of 64
# (vocabulary 97, intermediate 176) so that tandem's padding is exercised.
MODELS = {
    # RoPE theta 500000 with Llama 3.1 scaling; original_max_position_embeddings 32 < SEQ puts most
    # frequencies in the scaled and blended bands.
    "llama3": dict(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    ),
    # Default RoPE (theta 10000), tied embeddings, multi-head attention.
    "default_tied": dict(
        vocab_size=101,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    ),
}


def input_ids(vocab_size):
    g = torch.Generator().manual_seed(1234)
    return torch.randint(0, vocab_size, (BATCH, SEQ), generator=g)


def randomize(model, seed):
    """Weights large enough that attention is far from uniform (so RoPE shows in the logits)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # RMSNorm scales
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                std = (2.0 if ("q_proj" in name or "k_proj" in name) else 1.0) / p.shape[1] ** 0.5
                p.copy_(std * torch.randn(p.shape, generator=g))


def logits_of(model_dir, ids):
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids).logits.float().contiguous()


def as_v4_layout(config):
    """config.json as transformers 4.x writes it: rope_theta and rope_scaling at the top level."""
    rope = dict(config.pop("rope_parameters"))
    config["rope_theta"] = rope.pop("rope_theta")
    config["rope_scaling"] = rope if rope.get("rope_type", "default") != "default" else None
    if "dtype" in config:
        config["torch_dtype"] = config.pop("dtype")
    return config


def metadata(**extra):
    return {"magic": MAGIC, "version": VERSION, "transformers_version": transformers.__version__, **extra}


def write(out_dir):
    tensors = {}
    for seed, (name, args) in enumerate(MODELS.items()):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(LlamaConfig(**args)).float().eval()
        randomize(model, seed)
        v5 = os.path.join(out_dir, name + "_v5")
        model.save_pretrained(v5)
        v4 = os.path.join(out_dir, name + "_v4")
        shutil.copytree(v5, v4)
        with open(os.path.join(v5, "config.json")) as f:
            config = json.load(f)
        assert "rope_parameters" in config and "rope_theta" not in config, "not the transformers 5.x layout"
        with open(os.path.join(v4, "config.json"), "w") as f:
            json.dump(as_v4_layout(config), f, indent=2, sort_keys=True)
        ids = input_ids(args["vocab_size"])
        logits = logits_of(v5, ids)
        # transformers reads the rewritten 4.x layout as the same model.
        torch.testing.assert_close(logits_of(v4, ids), logits, rtol=0, atol=0)
        tensors[name + ".input_ids"] = ids
        tensors[name + ".logits"] = logits
    save_file(tensors, os.path.join(out_dir, "reference.safetensors"), metadata=metadata())


def forward(model_dir, out_file):
    with open(os.path.join(model_dir, "config.json")) as f:
        vocab_size = json.load(f)["vocab_size"]
    ids = input_ids(vocab_size)
    save_file({"input_ids": ids, "logits": logits_of(model_dir, ids)}, out_file, metadata=metadata())


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "write":
        write(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "forward":
        forward(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
