"""`tandem chat` as its users meet it: lines piped into `build/tandem chat` over a transformers Llama
folder with a byte-level BPE tokenizer written by `tokenizers` and a Llama-3 chat template. Each greedy
reply must equal transformers' own greedy generation of the same conversation laid out in the
Llama 3 format; bad input is one line on stderr and exit code 2."""

import shutil
import subprocess

import pytest
import torch

import tokenizers  # test-only packages, installed into .venv by scripts/setup.sh
import transformers

from llama_folder import CLI, llama3, write_llama_folder

CONTEXT = 128
MAX_TOKENS = 10
SYSTEM = "be brief"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny Llama whose tokenizer knows only the corpus's ASCII bytes, with a Llama-3 chat template."""
    return write_llama_folder(tmp_path_factory.mktemp("tiny-chat-llama"), CONTEXT, seed=1, all_bytes=False)


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
