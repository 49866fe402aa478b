"""tandem: train models larger than the GPU at the GPU's speed, from your own PyTorch loop.

``tandem.Engine(model, config)`` drives tandem's C++ offload engine under any ``nn.Module``;
``tandem.optim.OffloadAdamW(model, lr=...)`` is the same engine as a drop-in optimizer.
"""

import torch  # noqa: F401  (loads LibTorch before the extension)

from . import _C
from ._C import Tokenizer
from .blocks import BlockSpec, find_blocks, find_layers
from .engine import Engine, StepInfo
from . import data, optim

__version__ = _C.__version__
__all__ = ["Engine", "StepInfo", "BlockSpec", "find_blocks", "find_layers", "data", "optim", "config_keys",
           "Tokenizer"]


def config_keys() -> list:
    """Every config key ``tandem.Engine(config=...)`` accepts (``tandem config --keys`` explains each)."""
    return list(_C.config_key_names())
