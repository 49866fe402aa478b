"""tandem's C++ tokenizers against the reference libraries: byte-level BPE tokenizer.json files
trained here by Hugging Face `tokenizers` (GPT-2 style, Llama 3 style, Qwen style with NFC) and
SentencePiece models trained here by `sentencepiece`, on a multilingual sample: the same ids,
decode(encode(x)) == x, and `tandem tokenize` writing exactly the reference's ids + EOS."""

import json
import os
import random
import subprocess

import numpy as np
import pytest

tokenizers = pytest.importorskip("tokenizers")
try:
    import sentencepiece as spm
except ImportError:  # the byte-level BPE tests still run
    spm = None

import tandem  # noqa: E402
from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLI = os.environ.get("TANDEM_CLI", os.path.join(ROOT, "build", "tandem"))

# Llama 3's and Qwen 2's pre-tokenizer patterns (as their tokenizer.json files carry them).
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
         r"|\s+(?!\S)|\s+")

SAMPLE = [
    "Hello, world! It's a test: don't stop, we'll see. I'm sure they've gone, you'd agree.",
    "CASE'S AND 'LL: I'M, YOU'RE, WE'VE, SHE'D; the long s: 'ſ and 'Ś",
    "Ünïcödé façade naïve café résumé: Grüße aus Köln, Ærøskøbing, Łódź, İstanbul.",
    "日本語のテキストと漢字、中文字符：你好，世界！한국어 텍스트도 있습니다。",
    "Съешь же ещё этих мягких французских булок, да выпей чаю. Ґанок і їжак.",
    "مرحبا بالعالم، هذا نص عربي للاختبار. שלום עולם. नमस्ते दुनिया. สวัสดีครับ. Καλημέρα κόσμε.",
    "Emoji: 😀🎉👍🏽 family 👨‍👩‍👧‍👦 flag 🇫🇷🇯🇵 heart ❤️ keycap 1️⃣ rainbow 🏳️‍🌈 woman 👩🏾‍💻",
    "  leading spaces, trailing spaces   \t\ttabs\n\n\nnewlines\r\nwindows   \n  ",
    "Numbers: 1234567890 3.14159 1,000,000 2024-05-20 0x1F 12345678901234567890 ٣٤٥ ½ Ⅻ",
    "Special tokens in text: <|endoftext|> and <|eot_id|><|begin_of_text|>mid<|end_of_text|> <|im_start|>x",
    "Spaces of all kinds:\u00a0nbsp\u2003em\u3000ideographic\u2028line\u0085nel\x0bvt\x0cff\u200bzwsp",
    # U+0085 and U+000B: White_Space, so \s to Oniguruma and to ICU alike (Note [Byte-level BPE]).
    "Edge spaces: a \u0085b c \x0bd e\x0b\x0b f \u0085\u0085 g\u0085 \u0085h ¦ \u0085¦ \x0b¦",
    "def f(x):\n    return x**2  # comment\n\tif x != 0: print(f'{x!r}')  \n",
    " " * 40 + "x" + "\n" * 12 + "\t" * 5 + "y   ",
    "",
    " ",
    "\n",
    "a",
    "<|endoftext|>",
    "Mixed:abc123def,ΑΒΓ-абв_日本;😀x",
]
DECOMPOSED = "Decomposed: e\u0301, A\u030a, composed: é, Å; Hangul jamo: \u1100\u1161"


def corpus(lines=3000, seed=0):
    rng = random.Random(seed)
    words = " ".join(SAMPLE).split() + ["the", "and", "of", "to", "in", "is", "token", "model", "train"]
    out = list(SAMPLE) * 20
    for _ in range(lines):
        out.append(" ".join(rng.choice(words) for _ in range(rng.randint(3, 15))))
    return out


def byte_level_bpe(tmp_path, name, pre_tokenizer, specials, normalizer=None, template=None, ignore_merges=False):
    tok = tokenizers.Tokenizer(models.BPE())
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1500, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer)
    if template:
        tok.post_processor = processors.TemplateProcessing(single=f"{template} $A",
                                                           special_tokens=[(template, tok.token_to_id(template))])
    folder = tmp_path / name
    folder.mkdir()
    path = folder / "tokenizer.json"
    tok.save(str(path))
    if ignore_merges:  # as Llama 3 ships it; the trainer does not keep the flag
        j = json.loads(path.read_text())
        j["model"]["ignore_merges"] = True
        path.write_text(json.dumps(j, ensure_ascii=False))
    return str(folder), tokenizers.Tokenizer.from_file(str(path))


def gpt2(tmp_path, prefix_space=False):
    return byte_level_bpe(tmp_path, f"gpt2_{prefix_space}", pre_tokenizers.ByteLevel(add_prefix_space=prefix_space),
                          ["<|endoftext|>"])


def llama3(tmp_path):
    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated"),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    folder, ref = byte_level_bpe(tmp_path, "llama3", pre, specials, template="<|begin_of_text|>", ignore_merges=True)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                   "chat_template": "{{ '<|start_header_id|>' }}"}, f)
    return folder, ref


def qwen2(tmp_path):
    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2), behavior="isolated"),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return byte_level_bpe(tmp_path, "qwen2", pre, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                          normalizer=normalizers.NFC())


BPE_KINDS = {"gpt2": gpt2, "gpt2_prefix_space": lambda p: gpt2(p, True), "llama3": llama3, "qwen2_nfc": qwen2}
EOS = {"gpt2": "<|endoftext|>", "gpt2_prefix_space": "<|endoftext|>", "llama3": "<|eot_id|>",
       "qwen2_nfc": "<|endoftext|>"}


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def assert_same_ids(ours, ref, text):
    i = first_difference(ours, ref)
    assert ours == ref, (f"{text!r}: tandem and the reference differ at token {i} of {len(ref)}: "
                         f"tandem {ours[i:i + 5]}, reference {ref[i:i + 5]}")


def streamed(tok, ids):
    """token_bytes over ids as a streaming decoder calls it: `first` until a token other than a special
    (control) token has been seen."""
    control = {i for i, _ in tok.special_tokens}
    out, first = b"", True
    for i in ids:
        out += tok.token_bytes(i, first=first)
        first = first and i in control
    return out


@pytest.mark.parametrize("kind", list(BPE_KINDS))
def test_byte_level_bpe_ids_equal_tokenizers(tmp_path, kind):
    folder, ref = BPE_KINDS[kind](tmp_path)
    tok = tandem.Tokenizer.open(folder)
    assert tok.kind == "byte-level BPE"
    assert tok.vocab_size == ref.get_vocab_size()
    assert tok.eos_id == ref.token_to_id(EOS[kind])
    assert ref.get_vocab_size() > 600  # hundreds of merges were learned
    for text in SAMPLE + [DECOMPOSED]:
        ids = tok.encode(text)
        assert_same_ids(ids, ref.encode(text, add_special_tokens=False).ids, text)
        assert_same_ids(tok.encode(text, add_special_tokens=True), ref.encode(text).ids, text)
        assert tok.decode(ids) == ref.decode(ids, skip_special_tokens=False)
        assert tok.decode(ids, skip_special_tokens=True) == ref.decode(ids, skip_special_tokens=True)
        # NFC changes decomposed text; add_prefix_space adds a space before each piece of text.
        if kind != "gpt2_prefix_space" and (kind != "qwen2_nfc" or text != DECOMPOSED):
            assert tok.decode(ids) == text
            assert streamed(tok, ids) == text.encode()
    if kind == "llama3":
        assert tok.bos_id == ref.token_to_id("<|begin_of_text|>")
        assert tok.chat_template == "{{ '<|start_header_id|>' }}"
        assert tok.encode("hi", add_special_tokens=True)[0] == tok.bos_id


def sentencepiece_model(tmp_path, model_type, **options):
    path = tmp_path / f"sp_{model_type}.model"
    with open(path, "wb") as f:
        spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus()), model_writer=f, 
                                       model_type=model_type, minloglevel=2,
                                       user_defined_symbols=["<sep>"], **options)
    return str(path), spm.SentencePieceProcessor(model_file=str(path))


SP_KINDS = {
    # Llama 2's settings: BPE, bytes for unseen characters, text kept as written.
    "bpe_byte_fallback": dict(model_type="bpe", byte_fallback=True, normalization_rule_name="identity",
                              character_coverage=0.99, vocab_size=800,
                              remove_extra_whitespaces=False, split_digits=True),
    # SentencePiece's defaults: unigram, NFKC and collapsed whitespace, <unk> for unseen characters.
    "unigram": dict(model_type="unigram", character_coverage=0.98, vocab_size=320),
}


@pytest.mark.skipif(spm is None, reason="the sentencepiece package is not installed")
@pytest.mark.parametrize("kind", list(SP_KINDS))
def test_sentencepiece_ids_equal_sentencepiece(tmp_path, kind):
    path, ref = sentencepiece_model(tmp_path, **SP_KINDS[kind])
    tok = tandem.Tokenizer.open(path)
    assert tok.kind == "SentencePiece"
    assert tok.vocab_size == ref.get_piece_size() == SP_KINDS[kind]["vocab_size"]
    assert (tok.bos_id, tok.eos_id) == (ref.bos_id(), ref.eos_id())
    for text in SAMPLE + [DECOMPOSED, "a <sep> b", "<s>not control</s>"]:
        ids = tok.encode(text)
        assert_same_ids(ids, ref.encode(text), text)
        assert tok.encode(text, add_special_tokens=True) == [ref.bos_id()] + ref.encode(text)
        assert tok.decode(ids) == ref.decode(ids)
        assert streamed(tok, ids) == ref.decode(ids).encode()
        if kind == "bpe_byte_fallback":
            assert tok.decode(ids) == text


def run_cli(*args):
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=300)


def read_token_file(path):
    header = np.fromfile(path, dtype=np.int32, count=256)
    assert header[0] in (20240520, 20240801), f"{path}: magic {header[0]}"
    dtype = np.uint16 if header[0] == 20240520 else np.uint32
    tokens = np.fromfile(path, dtype=dtype, offset=1024)
    assert len(tokens) == header[2]
    return tokens


cli_only = pytest.mark.skipif(not os.path.exists(CLI), reason=f"no CLI at {CLI}")


@cli_only
@pytest.mark.parametrize("kind", ["gpt2", "llama3"])
def test_tokenize_command_writes_the_reference_ids(tmp_path, kind):
    folder, ref = BPE_KINDS[kind](tmp_path)
    eos = ref.token_to_id(EOS[kind])
    docs = [t for t in SAMPLE if t] * 2  # every 4th document (3, 7, ...) is held out
    with open(tmp_path / "docs.jsonl", "w") as f:
        for i, d in enumerate(docs):
            f.write(json.dumps({"id": i, "text": d}, ensure_ascii=False) + "\n")
    out = tmp_path / "data" / "train.bin"
    r = run_cli("tokenize", "--tokenizer", folder, "--out", str(out), "--val-fraction", "0.25", "--threads", "2",
                str(tmp_path / "docs.jsonl"))
    assert r.returncode == 0, r.stderr
    assert f"tokenized {len(docs)} documents" in r.stdout and str(out) in r.stdout, r.stdout
    train = [t for i, d in enumerate(docs) if i % 4 != 3 for t in ref.encode(d, add_special_tokens=False).ids + [eos]]
    val = [t for i, d in enumerate(docs) if i % 4 == 3 for t in ref.encode(d, add_special_tokens=False).ids + [eos]]
    np.testing.assert_array_equal(read_token_file(out), np.array(train))
    np.testing.assert_array_equal(read_token_file(tmp_path / "data" / "train_val.bin"), np.array(val))


@cli_only
def test_tokenize_command_long_text_in_pieces(tmp_path):
    # A text file over a task's megabyte is encoded in pieces on two threads (Note [Document pieces]):
    # the ids must be those of the whole text.
    folder, ref = llama3(tmp_path)
    rng = random.Random(1)
    lines = [t for t in SAMPLE if t.strip()]
    text = "".join(rng.choice(lines) + rng.choice(["\n", "\n\n", " \n", ".\n"]) for _ in range(16000))
    assert len(text.encode()) > (1 << 20) + 100000
    (tmp_path / "book.txt").write_text(text)
    out = tmp_path / "book.bin"
    r = run_cli("tokenize", "--tokenizer", folder, "--out", str(out), "--val-fraction", "0", "--threads", "2",
                str(tmp_path / "book.txt"))
    assert r.returncode == 0, r.stderr
    expected = ref.encode(text, add_special_tokens=False).ids + [ref.token_to_id("<|eot_id|>")]
    got = read_token_file(out)
    assert_same_ids(got.tolist(), expected, "book.txt")


@cli_only
def test_tokenize_command_bad_input_is_one_line(tmp_path):
    folder, _ = gpt2(tmp_path)
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{"text": broken}\n')
    (tmp_path / "ok.jsonl").write_text('{"body": "fine"}\n')
    cases = [
        (["--tokenizer", str(tmp_path / "nowhere"), str(tmp_path / "ok.jsonl")], "tokenizer"),
        (["--tokenizer", folder, str(tmp_path / "missing.txt")], "missing.txt' does not exist"),
        (["--tokenizer", folder, str(tmp_path / "bad.jsonl")], "bad.jsonl:2 is not valid JSON"),
        (["--tokenizer", folder, str(tmp_path / "ok.jsonl")], "has no field \"text\" (its fields: body)"),
    ]
    for args, needle in cases:
        r = run_cli("tokenize", "--out", str(tmp_path / "out.bin"), *args)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.count("\n") == 1 and needle in r.stderr, (args, r.stderr)
        assert not (tmp_path / "out.bin").exists()
    r = run_cli("tokenize", "--out", str(tmp_path / "out.bin"), "--tokenizer", folder, "--field", "body",
                str(tmp_path / "ok.jsonl"))
    assert r.returncode == 0, r.stderr
