"""`tandem chat` as its users meet it: lines piped into `build/tandem chat` over a transformers Llama
folder with a byte-level BPE tokenizer written by `tokenizers` and a Llama-3 chat template. Each greedy
reply must equal transformers' own greedy generation of the same conversation laid out in the
Llama 3 format; bad input is one line on stderr and exit code 2."""

import json
import os
import shutil
import subprocess

import pytest
import torch

import tokenizers  # test-only packages, installed into .venv by scripts/setup.sh
import transformers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLI = os.environ.get("TANDEM_CLI", os.path.join(ROOT, "build", "tandem"))
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
LLAMA3_TEMPLATE = ("{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
                   "{{ m['content'] }}<|eot_id|>{% endfor %}<|start_header_id|>assistant<|end_header_id|>\n\n")
CONTEXT = 128
MAX_TOKENS = 10
SYSTEM = "be brief"


def corpus():
    words = ["the", "model", "trains", "on", "every", "tier", "of", "memory", "GPU", "host", "cores", "tandem",
             "streams", "weights", "layer", "by", "layer", "and", "serves", "text"]
    g = torch.Generator().manual_seed(0)
    for _ in range(400):
        idx = torch.randint(0, len(words), (12,), generator=g).tolist()
        yield " ".join(words[i] for i in idx) + ".\n"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny Llama with a byte-level BPE tokenizer trained on ASCII text and a Llama-3 chat template."""
    d = tmp_path_factory.mktemp("tiny-chat-llama")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    # Only the corpus's ASCII bytes in the vocabulary: every reply is whole characters, so the text
    # that joins the conversation re-encodes to the same bytes in tandem and in `tokenizers`.
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS)
    tok.train_from_iterator(corpus(), trainer)
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "chat_template": LLAMA3_TEMPLATE}))
    torch.manual_seed(1)
    cfg = transformers.LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=CONTEXT, bos_token_id=tok.token_to_id("<|begin_of_text|>"),
                                   eos_token_id=tok.token_to_id("<|eot_id|>"))
    model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():  # larger weights than the init: varied greedy continuations
        for p in model.parameters():
            p.mul_(8.0 if p.dim() > 1 else 1.0)
    model.save_pretrained(str(d))
    return d


def llama3(messages):
    """The Llama 3 layout of `messages`, up to where the assistant's reply begins (Meta's model card)."""
    return "<|begin_of_text|>" + "".join(
        f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{m['content']}<|eot_id|>" for m in messages
    ) + "<|start_header_id|>assistant<|end_header_id|>\n\n"


class Reference:
    """transformers' greedy reply to a conversation, cut at <|eot_id|> and decoded as tandem shows text:
    special tokens left out (transformers' skip_special_tokens=True)."""

    def __init__(self, model_dir):
        self.tok = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.model = transformers.LlamaForCausalLM.from_pretrained(str(model_dir))
        self.eot = self.tok.token_to_id("<|eot_id|>")

    def reply(self, messages):
        ids = self.tok.encode(llama3(messages)).ids
        out = self.model.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False, top_p=None,
                                  top_k=None, temperature=None)
        new = out[0, len(ids):].tolist()
        if self.eot in new:
            new = new[:new.index(self.eot)]
        return self.tok.decode(new, skip_special_tokens=True)


def chat(args, lines):
    return subprocess.run([CLI, "chat", *args], input="".join(line + "\n" for line in lines), capture_output=True,
                          text=True, timeout=300)


def chat_args(model_dir, max_tokens=MAX_TOKENS):
    return ["--checkpoint", str(model_dir), "--device", "cpu", "--max-tokens", str(max_tokens), "--system", SYSTEM]


def test_two_turns_then_reset_equal_transformers_greedy(model_dir):
    ref = Reference(model_dir)
    conversation = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "serves text"}]
    first = ref.reply(conversation)
    conversation += [{"role": "assistant", "content": first}, {"role": "user", "content": "the model trains"}]
    second = ref.reply(conversation)
    assert first != second, "the fixture should answer the two turns differently"

    r = chat(chat_args(model_dir), ["serves text", "the model trains", "/reset", "serves text", "/exit", "ignored"])
    assert r.returncode == 0, r.stderr
    assert r.stdout == first + "\n" + second + "\n" + first + "\n"
    assert "llama3 chat" in r.stderr


def test_a_turn_beyond_the_context_is_refused_and_the_chat_goes_on(model_dir):
    ref = Reference(model_dir)
    first = ref.reply([{"role": "system", "content": SYSTEM}, {"role": "user", "content": "serves text"}])
    r = chat(chat_args(model_dir), ["the model " * 80, "", "serves text"])
    assert r.returncode == 0, r.stderr
    assert r.stdout == first + "\n"
    assert "this turn was not sent" in r.stderr and "context" in r.stderr and "/reset" in r.stderr


def one_error_line(r):
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and lines[0].startswith("tandem: error: "), r.stderr
    assert r.stdout == ""
    return lines[0]


def test_bad_input_is_one_line_and_exit_code_2(model_dir, tmp_path):
    line = one_error_line(chat(["--checkpoint", str(tmp_path / "absent"), "--device", "cpu"], ["hello"]))
    assert "absent" in line
    line = one_error_line(chat(["--checkpoint", str(model_dir), "--tokenizer", str(tmp_path / "tok.json"),
                                "--device", "cpu"], ["hello"]))
    assert "tok.json" in line
    bare = tmp_path / "no-tokenizer"  # weights without a tokenizer beside them
    bare.mkdir()
    for name in ["config.json", "model.safetensors"]:
        shutil.copy(model_dir / name, bare / name)
    line = one_error_line(chat(["--checkpoint", str(bare), "--device", "cpu"], ["hello"]))
    assert "tokenizer" in line and "--tokenizer" in line
    line = one_error_line(chat(chat_args(model_dir, max_tokens=0), ["hello"]))
    assert "--max-tokens" in line
    line = one_error_line(chat([*chat_args(model_dir), "--temperature", "-1"], ["hello"]))
    assert "temperature" in line
