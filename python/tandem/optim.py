"""``tandem.optim.OffloadAdamW``: the smallest change to a PyTorch loop, over the same engine."""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch
from torch import nn

from .config import ConfigArg
from .engine import Engine, StepInfo

__all__ = ["OffloadAdamW"]


class OffloadAdamW(torch.optim.Optimizer):
    """AdamW with its fp32 master weights and states in host memory, updated on the CPU while
    backward runs (and on the GPU for the first Blocks), as a drop-in optimizer::

        opt = tandem.optim.OffloadAdamW(model, lr=3e-4)
        for batch in loader:
            loss = model(**batch).loss
            loss.backward()
            opt.step()
            opt.zero_grad()

    The learning rate is read from ``param_groups[0]["lr"]`` at each step's forward, so PyTorch's
    LR schedulers work. Weight decay applies to parameters of two or more dimensions (not to norm
    scales and biases), as in GPT and LLaMA training recipes. One micro-batch per step, one
    process: for accumulation, fp16 loss scaling or data parallel use ``tandem.Engine``.

    Args:
        model: the model (not its parameters: the engine needs its Blocks).
        lr, betas, eps, weight_decay: AdamW's hyper-parameters (``weight_decay`` as torch's AdamW).
        max_grad_norm: global-norm clipping (0: none, as torch's AdamW).
        precision: "fp32", "bf16" or "fp16" working weights and autocast.
        config: further tandem config keys (see ``tandem.Engine``).
        blocks: the model's layers, when the automatic search should not choose them.
    """

    def __init__(self, model: nn.Module, lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, *, max_grad_norm: float = 0.0,
                 precision: str = "fp32", config: Optional[Dict[str, Any]] = None,
                 blocks: Optional[Sequence[nn.Module]] = None) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(
                f"OffloadAdamW takes the model itself (its Blocks are found from it), not a {type(model).__name__}"
            )
        if precision == "fp16":
            raise ValueError("OffloadAdamW has no loss scaling; use tandem.Engine with train.precision=fp16")
        keys: Dict[str, Any] = {
            "offload.optimizer": "cpu", "optim.type": "adamw", "optim.lr": lr, "optim.beta1": betas[0],
            "optim.beta2": betas[1], "optim.eps": eps, "optim.weight_decay": weight_decay,
            "optim.schedule": "constant", "optim.warmup_steps": 0, "train.grad_clip": max_grad_norm,
            "train.precision": precision, "train.grad_accum": 1,
        }
        keys.update(config or {})
        super().__init__([p for p in model.parameters() if p.requires_grad], dict(lr=lr, betas=betas, eps=eps,
                                                                                    weight_decay=weight_decay))
        self.engine = Engine(model, keys, blocks=blocks)
        if self.engine.world_size > 1:
            self.engine.close()
            raise ValueError("OffloadAdamW runs in one process; under torchrun use tandem.Engine and "
                             "engine.backward(loss), which weights each rank's share")
        self.engine._attach.lr_source = lambda: float(self.param_groups[0]["lr"])

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[StepInfo]:  # type: ignore[override]
        """The update after ``loss.backward()``: clipping (max_grad_norm), AdamW, new weights."""
        if closure is not None:
            with torch.enable_grad():
                closure()
        self.engine._core.end_backward()
        return self.engine._finish_step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing to do: the engine clears the gradients it has consumed (they live in its flat
        buffers, which the parameters' ``.grad`` are views of)."""

    def state_dict(self) -> Dict[str, Any]:
        raise NotImplementedError("OffloadAdamW's state lives in the engine: use opt.engine.save(path) and "
                                  "opt.engine.load(path)")

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        raise NotImplementedError("OffloadAdamW's state lives in the engine: use opt.engine.load(path)")
