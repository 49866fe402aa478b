"""tandem's tokenizer.json reader on model folders as transformers writes them: byte-level BPE
vocabularies trained here (test_tokenizers_parity's trainer), turned into fast tokenizers by
transformers' own converters (GPT2Converter, Qwen2Converter, TikTokenConverter from a .tiktoken
file of the trained ranks, as Llama 3 is converted, and MistralConverter from a tekken.json of them,
as Mistral NeMo's and later models' are), wrapped in the family's tokenizer
class and written by save_pretrained (tokenizer.json + tokenizer_config.json). The reference is
AutoTokenizer.from_pretrained on that folder: the same ids with and without the template's
special tokens on test_tokenizers_parity's sample and its 1 MB mixed text, the same decoded text,
the same BOS, EOS and vocabulary size."""

import base64
import json
import os
import types

import pytest

from test_tokenizers_parity import DECOMPOSED, LLAMA3, QWEN2, SAMPLE, byte_level_bpe, first_difference, mixed_text

transformers = pytest.importorskip("transformers")

import tandem  # noqa: E402
from tokenizers import AddedToken, Regex, normalizers, pre_tokenizers  # noqa: E402
from transformers import AutoTokenizer, GPT2TokenizerFast, PreTrainedTokenizerFast, Qwen2TokenizerFast  # noqa: E402
from transformers.convert_slow_tokenizer import (  # noqa: E402
    GPT2Converter, Qwen2Converter, TikTokenConverter, bytes_to_unicode)

# Llama 3.1's first special tokens, in its order, after the base vocabulary (128000... there).
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                   "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
                   "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
# Tekken's pre-tokenizer pattern (Mistral NeMo's tekken.json): letters split by case classes, digits
# one by one.
TEKKEN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?"
          r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
TEKKEN_SPECIALS = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]"]
TEXTS = SAMPLE + [DECOMPOSED, "<s>[INST] What's CamelCase? [/INST]ThisIsIt</s>", "HTTPServer XMLHttpRequest ǅungla", "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
                  "<|im_start|>system\nYou are.<|im_end|>\n<|im_start|>user\n", "<|reserved_special_token_1|> x"]


def trained(tmp_path, name, pre_tokenizer, specials, normalizer=None):
    """A byte-level BPE trained as test_tokenizers_parity trains one: its vocab and merges."""
    folder, _ = byte_level_bpe(tmp_path, name, pre_tokenizer, specials, normalizer=normalizer)
    with open(os.path.join(folder, "tokenizer.json"), encoding="utf-8") as f:
        model = json.load(f)["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    assert len(merges) > 600
    return model["vocab"], merges


def split_then_bytes(pattern):
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def gpt2_folder(tmp_path, **slow):
    """GPT2Converter(<a slow GPT2Tokenizer with `slow`'s settings>).converted(vocab, merges) as
    GPT2TokenizerFast saves it. <|endoftext|> is in the vocabulary, as in GPT-2's vocab.json."""
    vocab, merges = trained(tmp_path, "gpt2_trained", pre_tokenizers.ByteLevel(add_prefix_space=False),
                            ["<|endoftext|>"])
    if slow.get("add_bos_token"):
        slow.update(bos_token="<|endoftext|>", bos_token_id=vocab["<|endoftext|>"])
    backend = GPT2Converter(types.SimpleNamespace(**slow)).converted(vocab, merges)
    # add_bos_token is not passed on: the converter's own TemplateProcessing is what is written.
    return GPT2TokenizerFast(tokenizer_object=backend, add_prefix_space=slow.get("add_prefix_space", False))


def qwen2_folder(tmp_path):
    """Qwen2Converter(...).converted(vocab, merges) (NFC, Qwen 2's Split, ByteLevel) as
    Qwen2TokenizerFast saves it; the special tokens after the vocabulary in Qwen 2's order, EOS
    <|im_end|> and no BOS, as Qwen2-Instruct's tokenizer_config.json says."""
    vocab, merges = trained(tmp_path, "qwen2_trained", split_then_bytes(QWEN2), [], normalizer=normalizers.NFC())
    backend = Qwen2Converter(types.SimpleNamespace()).converted(vocab, merges)
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")])
    return Qwen2TokenizerFast(tokenizer_object=backend, bos_token=None, eos_token="<|im_end|>",
                              pad_token="<|endoftext|>", unk_token=None,
                              extra_special_tokens=["<|im_start|>", "<|im_end|>"])


def llama3_folder(tmp_path):
    """Llama 3 as transformers converts Meta's tokenizer.model: TikTokenConverter over a .tiktoken
    file of ranks (here the trained vocabulary's bytes, by id), Llama 3's pattern and special
    tokens (ignore_merges, merges rebuilt from the ranks); PreTrainedTokenizerFast adding BOS,
    EOS <|eot_id|>."""
    tiktoken = pytest.importorskip("tiktoken", reason="TikTokenConverter needs the tiktoken package")
    assert tiktoken  # the converter imports it itself
    vocab, _ = trained(tmp_path, "llama3_trained", split_then_bytes(LLAMA3), [])
    to_byte = {c: b for b, c in bytes_to_unicode().items()}
    ranks = tmp_path / "tokenizer.tiktoken"  # outside the folder: tandem reads the tokenizer.json
    with open(ranks, "wb") as f:
        for token, rank in sorted(vocab.items(), key=lambda kv: kv[1]):
            f.write(base64.b64encode(bytes(to_byte[c] for c in token)) + b" %d\n" % rank)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIKTOKEN_CACHE_DIR", "")  # tiktoken would cache the file by its path otherwise
        try:
            backend = TikTokenConverter(vocab_file=str(ranks), pattern=LLAMA3,
                                        extra_special_tokens=LLAMA3_SPECIALS).converted()
        except Exception as e:  # noqa: BLE001  (an environment where the converter cannot run offline)
            pytest.skip(f"transformers' TikTokenConverter failed on a local .tiktoken file: {e}")
    assert json.loads(backend.to_str())["model"]["ignore_merges"]
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
                                   add_bos_token=True)


def mistral_tekken_folder(tmp_path):
    """Mistral's tekken.json (the trained vocabulary's bytes by rank, Tekken's pattern, its special
    tokens first) turned into a fast tokenizer by transformers' own MistralConverter (byte-level BPE,
    ignore_merges, the specials at ids 0-4), as PreTrainedTokenizerFast saves it with BOS <s>."""
    from transformers.integrations.mistral.tokenizer import MistralConverter
    vocab, _ = trained(tmp_path, "tekken_trained", split_then_bytes(TEKKEN), [])
    to_byte = {c: b for b, c in bytes_to_unicode().items()}
    ranked = [bytes(to_byte[c] for c in token) for token, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    tekken = tmp_path / "tekken.json"  # outside the folder: tandem reads the tokenizer.json
    tekken.write_text(json.dumps({
        "config": {"pattern": TEKKEN, "num_vocab_tokens": len(ranked),
                   "default_vocab_size": len(ranked) + len(TEKKEN_SPECIALS),
                   "default_num_special_tokens": len(TEKKEN_SPECIALS), "version": "v3"},
        "vocab": [{"rank": r, "token_bytes": base64.b64encode(b).decode(), "token_str": None}
                  for r, b in enumerate(ranked)],
        "special_tokens": [{"rank": r, "token_str": t, "is_control": True} for r, t in enumerate(TEKKEN_SPECIALS)]}))
    backend = MistralConverter(vocab_file=str(tekken)).converted()
    assert json.loads(backend.to_str())["model"]["ignore_merges"]
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   add_bos_token=True)


FAMILIES = {
    "gpt2": lambda p: gpt2_folder(p, add_prefix_space=False),
    "gpt2_prefix_space": lambda p: gpt2_folder(p, add_prefix_space=True),
    "gpt2_bos": lambda p: gpt2_folder(p, add_bos_token=True),
    "qwen2": qwen2_folder,
    "llama3_tiktoken": llama3_folder,
    "mistral_tekken": mistral_tekken_folder,
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def converted(request, tmp_path_factory):
    """(family, model folder, AutoTokenizer of the folder, tandem.Tokenizer of the folder)."""
    tmp_path = tmp_path_factory.mktemp(request.param)
    folder = tmp_path / "model"
    FAMILIES[request.param](tmp_path).save_pretrained(str(folder))
    assert (folder / "tokenizer.json").is_file() and (folder / "tokenizer_config.json").is_file()
    return request.param, str(folder), AutoTokenizer.from_pretrained(str(folder)), tandem.Tokenizer.open(str(folder))


def assert_same_ids(ours, ref, text, auto, what):
    """The full id lists equal; else the first differing position, the ids and tokens around it and
    where in the text it is."""
    if ours == ref:
        return
    i = first_difference(ours, ref)
    at = len(auto.decode(ref[:i], clean_up_tokenization_spaces=False))
    lo = max(0, i - 3)
    pytest.fail(f"{what}: tandem and transformers differ at token {i} (tandem {len(ours)} tokens, transformers "
                f"{len(ref)}), near character {at} of the text: {text[max(0, at - 30):at + 40]!r}\n"
                f"  tandem       ids[{lo}:{i + 5}] {ours[lo:i + 5]} {auto.convert_ids_to_tokens(ours[lo:i + 5])}\n"
                f"  transformers ids[{lo}:{i + 5}] {ref[lo:i + 5]} {auto.convert_ids_to_tokens(ref[lo:i + 5])}")


def test_the_folder_opens_with_the_references_specials(converted):
    family, folder, auto, tok = converted
    assert tok.kind == "byte-level BPE"
    assert tok.vocab_size == len(auto) > 1000
    assert tok.eos_id == auto.eos_token_id is not None
    assert tok.bos_id == auto.bos_token_id
    if family == "gpt2_bos" or family.startswith("llama3"):  # the template adds BOS
        assert auto.encode("hi", add_special_tokens=True)[0] == auto.bos_token_id


def test_sample_ids_and_text_equal_transformers(converted):
    family, _, auto, tok = converted
    for text in TEXTS:
        for special in (False, True):
            ids = auto.encode(text, add_special_tokens=special)
            assert_same_ids(tok.encode(text, add_special_tokens=special), ids, text, auto,
                            f"{family}, {text!r}, add_special_tokens={special}")
            for skip in (False, True):
                assert tok.decode(ids, skip_special_tokens=skip) == auto.decode(
                    ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False), (family, text, skip)


def test_long_mixed_text_ids_equal_transformers(converted):
    family, _, auto, tok = converted
    text = mixed_text()
    assert len(text.encode()) >= 1 << 20
    for special in (False, True):
        assert_same_ids(tok.encode(text, add_special_tokens=special), auto.encode(text, add_special_tokens=special),
                        text, auto, f"{family}, the 1 MB text, add_special_tokens={special}")


@pytest.mark.parametrize("converted", ["llama3_tiktoken"], indirect=True)
def test_llama3_ids_equal_tiktoken(converted):
    # The .tiktoken file the Llama 3 folder was converted from, read by tiktoken itself: the ids
    # Meta's own tokenizer gives (no BOS; special tokens in the text allowed).
    _, folder, auto, tok = converted
    from tiktoken import Encoding
    from tiktoken.load import load_tiktoken_bpe
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIKTOKEN_CACHE_DIR", "")
        ranks = load_tiktoken_bpe(os.path.join(os.path.dirname(folder), "tokenizer.tiktoken"))
    enc = Encoding("trained", pat_str=LLAMA3, mergeable_ranks=ranks,
                   special_tokens={s: len(ranks) + i for i, s in enumerate(LLAMA3_SPECIALS)})
    for text in TEXTS + [mixed_text()]:
        assert_same_ids(tok.encode(text), enc.encode(text, allowed_special="all"), text, auto,
                        f"tiktoken, {text[:40]!r}")
