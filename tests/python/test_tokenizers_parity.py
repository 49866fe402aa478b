"""tandem's C++ tokenizers against the reference libraries: byte-level BPE tokenizer.json files
trained here by Hugging Face `tokenizers` (GPT-2 style, Llama 3 style, Qwen style with NFC),
SentencePiece models trained here by `sentencepiece`, and those models converted to
SentencePiece-style BPE tokenizer.json files by transformers' own converters (Llama legacy and
not, Gemma, a bare tokenizer.model), on a multilingual sample: the same ids and decoded text,
decode(encode(x)) == x, and `tandem tokenize` writing exactly the reference's ids + EOS."""

import json
import os
import random
import subprocess
import types

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
    # Unigram with case folding, bytes for unseen characters and no dummy prefix; and with the text's
    # spaces kept (Note [SentencePiece normalization]).
    "unigram_cf_bytes": dict(model_type="unigram", normalization_rule_name="nmt_nfkc_cf", byte_fallback=True,
                             add_dummy_prefix=False, character_coverage=0.98, vocab_size=600),
    "unigram_spaces_kept": dict(model_type="unigram", normalization_rule_name="identity",
                                remove_extra_whitespaces=False, character_coverage=0.98, vocab_size=320),
    # BPE with SentencePiece's defaults (NFKC, whitespace collapsed, <unk> for unseen characters),
    # BPE with the text kept but no byte fallback, and a char model.
    "bpe_defaults": dict(model_type="bpe", character_coverage=0.98, vocab_size=600),
    "bpe_identity_no_fallback": dict(model_type="bpe", normalization_rule_name="identity",
                                     remove_extra_whitespaces=False, character_coverage=0.98, vocab_size=600),
    "char": dict(model_type="char", character_coverage=0.98, vocab_size=200),
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


# ---- SentencePiece-style BPE: tokenizer.json as transformers converts a tokenizer.model ----------
# Note [SentencePiece-style BPE]. The converters' normalizer, pre-tokenizer and decoder are taken
# from transformers itself; the BPE model is built from the trained model's pieces as transformers
# builds it (convert_slow_tokenizer's SentencePieceExtractor needs protobuf, which this environment
# need not have, so the pieces come from SentencePieceProcessor instead).

try:
    import transformers  # noqa: F401
    from transformers.convert_slow_tokenizer import LlamaConverter, SpmConverter
    from transformers.tokenization_utils_base import generate_merges
except ImportError:
    transformers = None

USER_DEFINED = ["<sep>"]


def sp_pieces(sp):
    """The model's pieces with SentencePiece's type numbers (1 normal, 2 unknown, 3 control, 4 user, 6 byte)."""
    def kind(i):
        if sp.IsUnknown(i):
            return 2
        if sp.IsControl(i):
            return 3
        if sp.IsByte(i):
            return 6
        return 4 if sp.id_to_piece(i) in USER_DEFINED else 1
    return [types.SimpleNamespace(piece=sp.id_to_piece(i), score=sp.get_score(i), type=kind(i))
            for i in range(sp.get_piece_size())]


def added_pieces(pieces):
    """Control and user-defined pieces as the converters add them: not normalized; control ones special."""
    return [tokenizers.AddedToken(p.piece, normalized=False, special=p.type == 3) for p in pieces if p.type in (3, 4)]


def llama_converter(pieces, legacy):
    """LlamaConverter(...).converted() for a model whose slow tokenizer has `legacy`, with the
    post-processor LlamaTokenizerFast adds (BOS)."""
    conv = LlamaConverter.__new__(LlamaConverter)  # its proto is not needed by the methods used
    conv.original_tokenizer = types.SimpleNamespace(legacy=legacy, add_prefix_space=True)
    vocab = {p.piece: i for i, p in enumerate(pieces)}
    merges = generate_merges(vocab, [(p.piece, p.score) for p in pieces])  # as SpmConverter.tokenizer ranks them
    tok = tokenizers.Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True,
                                          dropout=None))
    tok.add_tokens(added_pieces(pieces))
    if (normalizer := conv.normalizer(None)) is not None:
        tok.normalizer = normalizer
    if (pre := conv.pre_tokenizer("\u2581", True)) is not None:
        tok.pre_tokenizer = pre
    tok.decoder = conv.decoder("\u2581", True)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return tok


def transformers_class(cls_name, pieces, **kwargs):
    """transformers 5's LlamaTokenizer / GemmaTokenizer as from_pretrained builds it from a tokenizer.model."""
    vocab = {p.piece: i for i, p in enumerate(pieces)}
    cls = getattr(transformers, cls_name)
    if cls_name == "GemmaTokenizer":  # its own special-token names; ours are <unk> <s> </s>
        kwargs.update(unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<unk>", mask_token="<unk>")
    t = cls(vocab=vocab, merges=generate_merges(vocab), add_bos_token=True,
            additional_special_tokens=added_pieces(pieces), **kwargs)
    return t.backend_tokenizer


def spm_proto(pieces, legacy):
    """SpmConverter.build_tokenizer_from_spm_proto: a tokenizer.model without a model class."""
    proto = types.SimpleNamespace(
        pieces=pieces, trainer_spec=types.SimpleNamespace(byte_fallback=True, unk_piece="<unk>"),
        normalizer_spec=types.SimpleNamespace(precompiled_charsmap=b"", remove_extra_whitespaces=False,
                                              escape_whitespaces=True, add_dummy_prefix=True))
    tok = SpmConverter.build_tokenizer_from_spm_proto(proto, {p.piece: i for i, p in enumerate(pieces)}, legacy=legacy)
    tok.add_tokens(added_pieces([p for p in pieces if p.type == 3]))
    return tok


SP_BPE_SHAPES = {
    # normalizer Sequence[Prepend, Replace], no pre-tokenizer (Llama 2 and Mistral v0.1 on the Hub)
    "llama_converter_legacy": lambda p: llama_converter(p, legacy=True),
    # no normalizer, Metaspace(prepend_scheme first, split false)
    "llama_converter": lambda p: llama_converter(p, legacy=False),
    "llama5": lambda p: transformers_class("LlamaTokenizer", p, legacy=False),
    "llama5_legacy": lambda p: transformers_class("LlamaTokenizer", p, legacy=True),  # Metaspace always
    "llama5_no_prefix": lambda p: transformers_class("LlamaTokenizer", p, legacy=False, add_prefix_space=False),
    # normalizer Replace(" ", "▁"), Split(" ", MergedWithPrevious), no Strip decoder
    "gemma5": lambda p: transformers_class("GemmaTokenizer", p),
    # Replace normalizers (one a regex), Metaspace, a Split of user-defined pieces, ignore_merges
    "spm_proto_legacy": lambda p: spm_proto(p, legacy=True),
    "spm_proto": lambda p: spm_proto(p, legacy=False),
}
SP_BPE_TEXTS = SAMPLE + [DECOMPOSED, "a <sep> b", "<s>not control</s>", " leading", "x  <s> y", "<s> z", "▁x ▁",
                         "\U0001F600 unseen \u0915\u094D\u0937 \uFFFF \U0010FFFF"]


def shown(tok, ids):
    """token_bytes over ids as serve's TextStream shows them: special (control) tokens as nothing."""
    control = {i for i, _ in tok.special_tokens}
    return streamed(tok, [i for i in ids if i not in control])


@pytest.fixture(scope="module")
def sp_bpe_pieces(tmp_path_factory):
    _, sp = sentencepiece_model(tmp_path_factory.mktemp("sp"), **SP_KINDS["bpe_byte_fallback"])
    return sp_pieces(sp)


def mixed_text(size=1 << 20, seed=2):
    rng = random.Random(seed)
    lines = [t for t in SP_BPE_TEXTS if t.strip()]
    parts, n = [], 0
    while n < size:
        parts.append(rng.choice(lines) + rng.choice(["\n", " ", "\n\n", "  ", "<s>", "\t"]))
        n += len(parts[-1].encode())
    return "".join(parts)


@pytest.mark.skipif(spm is None, reason="the sentencepiece package is not installed")
@pytest.mark.parametrize("kind", list(SP_KINDS))
def test_a_sentencepiece_model_encodes_a_long_text_as_the_package(tmp_path, kind):
    # BPE models are encoded as SentencePiece-style BPE (Note [SentencePiece model as BPE]), the
    # unigram models by tandem's own encoder (Note [SentencePiece unigram]), the char model by its
    # own (Note [SentencePiece char model]), a text holding a user-defined piece of a BPE or char
    # model by the library.
    path, ref = sentencepiece_model(tmp_path, **SP_KINDS[kind])
    tok = tandem.Tokenizer.open(path)
    with_piece = mixed_text()
    assert "<sep>" in with_piece
    for text in (with_piece, with_piece.replace("<sep>", "<se p>")):
        assert_same_ids(tok.encode(text), ref.encode(text), "the 1 MB text")


@pytest.mark.skipif(spm is None or transformers is None, reason="needs sentencepiece and transformers")
@pytest.mark.parametrize("shape", list(SP_BPE_SHAPES))
def test_sentencepiece_style_bpe_equals_tokenizers(tmp_path, sp_bpe_pieces, shape):
    folder = tmp_path / shape
    folder.mkdir()
    SP_BPE_SHAPES[shape](sp_bpe_pieces).save(str(folder / "tokenizer.json"))
    ref = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert json.loads((folder / "tokenizer.json").read_text())["model"]["byte_fallback"]
    tok = tandem.Tokenizer.open(str(folder))
    assert tok.kind == "SentencePiece-style BPE"
    assert tok.vocab_size == ref.get_vocab_size()
    assert tok.eos_id == ref.token_to_id("</s>") and tok.bos_id == ref.token_to_id("<s>")
    for text in SP_BPE_TEXTS:
        ids = tok.encode(text)
        assert_same_ids(ids, ref.encode(text, add_special_tokens=False).ids, text)
        assert_same_ids(tok.encode(text, add_special_tokens=True), ref.encode(text).ids, text)
        assert tok.decode(ids) == ref.decode(ids, skip_special_tokens=False), text
        assert tok.decode(ids, skip_special_tokens=True) == ref.decode(ids, skip_special_tokens=True), text
        assert shown(tok, ids) == ref.decode(ids, skip_special_tokens=True).encode(), text
    # Byte tokens that are not a character, alone and in runs: one U+FFFD per token, as ByteFallback does.
    byte = {b: ref.token_to_id(f"<0x{b:02X}>") for b in (0xE6, 0x97, 0xA5, 0x41)}
    for ids in ([byte[0xE6], byte[0x97]], [byte[0xE6], byte[0x97], byte[0xA5]], [byte[0x97], 300, byte[0x41]]):
        assert tok.decode(ids) == ref.decode(ids, skip_special_tokens=False), ids
    text = mixed_text()
    ids = tok.encode(text)
    assert_same_ids(ids, ref.encode(text, add_special_tokens=False).ids, "the 1 MB text")
    assert tok.decode(ids) == ref.decode(ids, skip_special_tokens=False)


@cli_only
@pytest.mark.skipif(spm is None or transformers is None, reason="needs sentencepiece and transformers")
def test_tokenize_command_reads_sentencepiece_style_json(tmp_path, sp_bpe_pieces):
    SP_BPE_SHAPES["llama5"](sp_bpe_pieces).save(str(tmp_path / "tokenizer.json"))
    ref = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    docs = [t for t in SP_BPE_TEXTS if t]
    with open(tmp_path / "docs.jsonl", "w") as f:
        for d in docs:
            f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
    out = tmp_path / "docs.bin"
    r = run_cli("tokenize", "--tokenizer", str(tmp_path), "--out", str(out), "--val-fraction", "0", "--threads", "2",
                str(tmp_path / "docs.jsonl"))
    assert r.returncode == 0, r.stderr
    eos = ref.token_to_id("</s>")
    expected = [t for d in docs for t in ref.encode(d, add_special_tokens=False).ids + [eos]]
    np.testing.assert_array_equal(read_token_file(out), np.array(expected))
