#!/usr/bin/env python3
"""Reference greedy generations from transformers for tests/serve/transformers_generate_test.cpp.

  write OUT_DIR   Saves a tiny LlamaForCausalLM (vocabulary 97 and feed-forward 176, not multiples
                  of 64; Llama 3.1 RoPE scaling; untied head) to OUT_DIR/model with save_pretrained,
                  and writes OUT_DIR/reference.safetensors: prompt_<i> and output_<i>, the prompt ids
                  and the ids transformers' generate() adds greedily, for prompts of several lengths.

The reference file carries MAGIC and VERSION in its safetensors metadata; the test checks them.
"""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local; never reach for the hub

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

transformers.utils.logging.disable_progress_bar()
transformers.utils.logging.set_verbosity_error()

MAGIC = "tandem-generate-reference"
VERSION = "1"
NEW_TOKENS = 24
PROMPT_LENGTHS = [5, 17, 1, 40]


def write(out_dir):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=176, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
                      pad_token_id=None,
                      rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 32})
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # larger weights than the init: varied greedy continuations
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(6.0)
    model.save_pretrained(os.path.join(out_dir, "model"))
    g = torch.Generator().manual_seed(1)
    tensors = {}
    for i, n in enumerate(PROMPT_LENGTHS):
        ids = torch.randint(0, cfg.vocab_size, (1, n), generator=g)
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                                 min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
        tensors[f"prompt_{i}"] = ids[0].contiguous()
        tensors[f"output_{i}"] = out[0, n:].contiguous()
    save_file(tensors, os.path.join(out_dir, "reference.safetensors"), metadata={"magic": MAGIC, "version": VERSION})


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "write":
        sys.exit(__doc__)
    write(sys.argv[2])
