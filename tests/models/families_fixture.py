#!/usr/bin/env python3
"""Reference outputs from transformers for tests/models/families_test.cpp, one tiny model per decoder
family and RoPE scaling tandem reads (Note [Decoder families]).

  write OUT_DIR      For each case of CASES: builds the model from its config, gives every weight
                     random values (norm scales and biases too, so that a dropped term shows), saves
                     it with save_pretrained to OUT_DIR/<case>, and writes OUT_DIR/reference.safetensors:
                     <case>.input_ids (2 x 48), <case>.logits (fp32, eager attention), <case>.loss
                     (the causal-LM loss of those ids) and, for prompts of several lengths,
                     <case>.prompt_<i> and <case>.output_<i>: the ids generate() adds greedily.
  forward MODEL_DIR OUT_FILE
                     Loads MODEL_DIR (one tandem wrote) with transformers and writes its fp32 logits
                     for the case's input ids to OUT_FILE.

Both files carry MAGIC and VERSION in their safetensors metadata; the test checks them.
"""

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local; never reach for the hub

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

transformers.utils.logging.disable_progress_bar()
transformers.utils.logging.set_verbosity_error()

MAGIC = "tandem-families-reference"
VERSION = "1"
BATCH, SEQ = 2, 48
NEW_TOKENS = 16
PROMPT_LENGTHS = [5, 19, 30]
NO_SPECIAL = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)

# Vocabulary 97 and feed-forward 176 are not multiples of 64: tandem's padding is exercised.
LLAMA = dict(vocab_size=97, hidden_size=64, intermediate_size=176, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, tie_word_embeddings=False)

# case -> (config class, arguments). Windows of 8 keys and soft caps small enough to bite.
CASES = {
    "qwen2": ("Qwen2Config", dict(LLAMA, rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    "qwen2_window": ("Qwen2Config", dict(LLAMA, use_sliding_window=True, sliding_window=8, max_window_layers=1)),
    "mistral": ("MistralConfig", dict(LLAMA, sliding_window=8)),
    "gemma": ("GemmaConfig", dict(LLAMA, head_dim=24, hidden_act="gelu_pytorch_tanh", tie_word_embeddings=True)),
    "gemma2": ("Gemma2Config", dict(LLAMA, head_dim=24, sliding_window=8, query_pre_attn_scalar=20,
                                    attn_logit_softcapping=3.0, final_logit_softcapping=4.0,
                                    tie_word_embeddings=True)),
    "phi3": ("Phi3Config", dict(LLAMA, sliding_window=12, rope_parameters={
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})),
    "gpt2": ("GPT2Config", dict(vocab_size=97, n_embd=64, n_layer=3, n_head=4, n_positions=128, n_inner=176)),
    "llama_bias": ("LlamaConfig", dict(LLAMA, attention_bias=True, mlp_bias=True)),
    "llama_linear": ("LlamaConfig", dict(LLAMA, rope_parameters={
        "rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0})),
    # Sequences of 48 beyond the 32 positions: the dynamic base rises with the length.
    "llama_dynamic": ("LlamaConfig", dict(LLAMA, max_position_embeddings=32, rope_parameters={
        "rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0})),
    "llama_yarn": ("LlamaConfig", dict(LLAMA, rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32})),
}


def build(case):
    cls, args = CASES[case]
    config = getattr(transformers, cls)(**args, **NO_SPECIAL)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").float().eval()


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # norm scales (ones, or Gemma's zeros) and biases (zeros), moved off their start
                p.copy_(p.mean() + 0.3 * torch.randn(p.shape, generator=g))
            elif "embed" in name or "wte" in name or "wpe" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[0] if "c_" in name else p.shape[1]  # GPT-2's Conv1D stores (in, out)
                p.copy_(2.0 / fan_in ** 0.5 * torch.randn(p.shape, generator=g))


def input_ids(vocab_size, seed=1234):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (BATCH, SEQ), generator=g)


def load(model_dir):
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                              attn_implementation="eager")
    return model.eval()


def metadata(**extra):
    return {"magic": MAGIC, "version": VERSION, "transformers_version": transformers.__version__, **extra}


def write(out_dir):
    tensors = {}
    for seed, case in enumerate(CASES):
        torch.manual_seed(seed)
        model = build(case)
        randomize(model, seed)
        path = os.path.join(out_dir, case)
        model.save_pretrained(path)
        model = load(path)  # what a user loads
        ids = input_ids(model.config.vocab_size)
        with torch.no_grad():
            out = model(input_ids=ids, labels=ids)
        tensors[case + ".input_ids"] = ids
        tensors[case + ".logits"] = out.logits.float().contiguous()
        tensors[case + ".loss"] = out.loss.float().reshape(1)
        g = torch.Generator().manual_seed(seed + 100)
        for i, n in enumerate(PROMPT_LENGTHS):
            prompt = torch.randint(0, model.config.vocab_size, (1, n), generator=g)
            with torch.no_grad():
                gen = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS,
                                     min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
            tensors[f"{case}.prompt_{i}"] = prompt[0].contiguous()
            tensors[f"{case}.output_{i}"] = gen[0, n:].contiguous()
    save_file(tensors, os.path.join(out_dir, "reference.safetensors"), metadata=metadata())


def forward(model_dir, out_file):
    with open(os.path.join(model_dir, "config.json")) as f:
        vocab_size = json.load(f)["vocab_size"]
    ids = input_ids(vocab_size)
    with torch.no_grad():
        logits = load(model_dir)(input_ids=ids).logits.float().contiguous()
    save_file({"input_ids": ids, "logits": logits}, out_file, metadata=metadata())


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "write":
        write(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "forward":
        forward(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
