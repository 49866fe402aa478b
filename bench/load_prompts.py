"""The prompts of bench/serve_load.py's mixed load (--mix): windows of a drawn number of tokens of a
real text at random places, cut by the served folder's tokenizer where `tokenizers` is installed."""

import argparse
import glob
import os


class PromptsUnavailable(Exception):
    """The text cannot give prompts."""


def default_text():
    """The text --mix cuts prompts from by default: this repository's README and docs."""
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    parts = []
    for path in [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md"))):
        with open(path, errors="replace") as f:
            parts.append(f.read())
    return "\n".join(parts)


def int_range(text):
    """'LO-HI' as (LO, HI), 1 <= LO <= HI."""
    try:
        lo, hi = (int(v) for v in text.split("-"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a range LO-HI of whole numbers") from None
    if not 1 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"'{text}': a range needs 1 <= LO <= HI")
    return lo, hi


class PromptSource:
    """--mix's prompts: windows of `n` tokens of a text at random places. With a tokenizer.json and
    the `tokenizers` package the text is tokenized once and a window is decoded from its ids; without,
    a window is n words."""

    def __init__(self, text, tokenizer_json=None):
        self.ids, self.decode, self.counted = None, None, "words"
        if tokenizer_json and os.path.exists(tokenizer_json):
            try:
                import tokenizers  # a test and benchmark package, not tandem's
            except ImportError:
                tokenizers = None
            if tokenizers is not None:
                tok = tokenizers.Tokenizer.from_file(tokenizer_json)
                self.ids = tok.encode(text, add_special_tokens=False).ids
                self.decode = tok.decode
                self.counted = "tokens"
        self.words = text.split()
        units = len(self.ids) if self.ids is not None else len(self.words)
        if units < 2:
            raise PromptsUnavailable("the text for --mix holds too little to cut prompts from")

    def prompt(self, rng, n):
        """A prompt of n tokens (words without a tokenizer): the text from a random place, wrapped."""
        units = self.ids if self.ids is not None else self.words
        start = rng.randrange(len(units))
        window = [units[(start + i) % len(units)] for i in range(n)]
        return self.decode(window) if self.ids is not None else " ".join(window)
