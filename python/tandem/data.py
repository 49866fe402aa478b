"""The CLI's token files in a Python loop: the very batches ``tandem train`` would draw."""

from __future__ import annotations

from typing import Iterator, Optional, Tuple

import torch

from . import _C
from .config import ConfigArg, split_config

__all__ = ["TokenBatches"]


class TokenBatches:
    """Batches ``(inputs, targets)`` (B, T) int64 on the CPU from ``data.path`` (a nanoGPT or
    llm.c token file, or ``synthetic``), sampled as the CLI samples them (``train.seed``,
    ``train.micro_batch``, ``train.seq_len``); ``targets`` are ``inputs`` shifted by one.

    Args:
        config: tandem config keys (at least ``train.seq_len``).
        vocab_size: every token must be below it (checked per batch).
        rows, first_row: this rank's rows of each global batch (data parallel); 0 = all.
    """

    def __init__(self, config: ConfigArg, vocab_size: int, rows: int = 0, first_row: int = 0) -> None:
        files, keys = split_config(config)
        self._impl = _C.TokenBatches(files, keys, vocab_size, rows, first_row)

    def __iter__(self) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        return self

    def __next__(self) -> Tuple[torch.Tensor, torch.Tensor]:
        return self._impl.next()

    @property
    def position(self) -> int:
        """Batches handed out so far."""
        return self._impl.position()

    def seek(self, position: int) -> None:
        self._impl.seek(position)
