"""Tiny transformers folders for the serving tests (test_serve.py, test_chat.py, test_families.py): a
byte-level BPE tokenizer trained by `tokenizers` on a small word corpus, the Llama-3 special tokens
and chat template, and random weights scaled up so that greedy continuations vary."""

import json
import os

import torch

import tokenizers  # test-only packages, installed into .venv by scripts/setup.sh
import transformers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLI = os.environ.get("TANDEM_CLI", os.path.join(ROOT, "build", "tandem"))
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
LLAMA3_TEMPLATE = ("{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
                   "{{ m['content'] }}<|eot_id|>{% endfor %}<|start_header_id|>assistant<|end_header_id|>\n\n")


def corpus():
    words = ["the", "model", "trains", "on", "every", "tier", "of", "memory", "GPU", "host", "cores", "tandem",
             "streams", "weights", "layer", "by", "layer", "and", "serves", "text"]
    g = torch.Generator().manual_seed(0)
    for _ in range(400):
        idx = torch.randint(0, len(words), (12,), generator=g).tolist()
        yield " ".join(words[i] for i in idx) + ".\n"


def write_tokenizer(d, all_bytes):
    """A byte-level BPE tokenizer trained on corpus() with the Llama-3 special tokens, into `d`."""
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    extra = {"initial_alphabet": tokenizers.pre_tokenizers.ByteLevel.alphabet()} if all_bytes else {}
    tok.train_from_iterator(corpus(), tokenizers.trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS, **extra))
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "chat_template": LLAMA3_TEMPLATE}))
    return tok


def write_model_folder(d, config_class, config, seed, all_bytes=True):
    """A folder of `config_class` (a transformers config class name) with the tokenizer above:
    `config` gives the shapes (the vocabulary and token ids are the tokenizer's), weights from
    `seed`, scaled up so that greedy continuations vary."""
    tok = write_tokenizer(d, all_bytes)
    torch.manual_seed(seed)
    cfg = getattr(transformers, config_class)(vocab_size=tok.get_vocab_size(),
                                              bos_token_id=tok.token_to_id("<|begin_of_text|>"),
                                              eos_token_id=tok.token_to_id("<|eot_id|>"), pad_token_id=None, **config)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():  # larger weights than the init: varied greedy continuations
        for p in model.parameters():
            p.mul_(8.0 if p.dim() > 1 else 1.0)
    model.save_pretrained(str(d))
    return d


def write_llama_folder(d, context, seed, all_bytes):
    """The Llama folder of the serving tests: `context` positions, weights from `seed`; with
    `all_bytes` every byte is in the vocabulary, else only the corpus's ASCII bytes (then every reply
    is whole characters, and re-encodes to the same bytes in tandem and in `tokenizers`)."""
    return write_model_folder(d, "LlamaConfig", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                     num_attention_heads=4, num_key_value_heads=2,
                                                     max_position_embeddings=context), seed, all_bytes)


def llama3(messages):
    """The Llama 3 layout of `messages`, up to where the assistant's reply begins (Meta's model card)."""
    return "<|begin_of_text|>" + "".join(
        f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{m['content']}<|eot_id|>" for m in messages
    ) + "<|start_header_id|>assistant<|end_header_id|>\n\n"
