"""``tandem.optim.OffloadAdamW``: torch's AdamW, over tandem's offload engine."""

from __future__ import annotations

import gc
import warnings
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from .engine import Engine, StepInfo

__all__ = ["OffloadAdamW"]

_HYPER = ("lr", "betas", "eps", "weight_decay")


def _owner(params: List[torch.Tensor]) -> nn.Module:
    """The outermost live module holding every one of `params` (the model they were taken from)."""
    ids = {id(p) for p in params}
    best, best_n = None, -1
    with warnings.catch_warnings():  # some live objects warn when asked their class
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            if isinstance(obj, nn.Module):
                mine = {id(p) for p in obj.parameters()}
                if ids <= mine and len(mine) > best_n:
                    best, best_n = obj, len(mine)
    if best is None:
        raise ValueError("OffloadAdamW found no module holding all its parameters; pass the model: "
                         "OffloadAdamW(params, lr=..., model=model)")
    return best


class OffloadAdamW(torch.optim.Optimizer):
    """``torch.optim.AdamW`` with the fp32 master weights and moments in host memory, updated on the
    CPU while backward runs (and on the GPU for the first Blocks)::

        opt = tandem.optim.OffloadAdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
        for batch in loader:
            loss = model(**batch).loss
            loss.backward()
            opt.step()
            opt.zero_grad()

    It takes what torch's AdamW takes (an iterable of parameters or of param groups, lr, betas, eps,
    weight_decay) and updates as it does, step for step: each group with its own hyper-parameters,
    every parameter of a group decayed by its weight decay (biases and norm scales too), changes to
    ``param_groups`` (a scheduler's lr, a new weight decay) taken at the next step's forward,
    ``add_param_group``, ``state_dict``/``load_state_dict`` (with the fp32 masters, so a resume is
    exact in any precision). The engine needs the model's Blocks, so it finds the module the
    parameters belong to (or pass ``model=``); the model itself may also be passed in place of the
    parameters. Parameters of the model in no group are not updated, as torch leaves them (their
    gradients are not kept from step to step: torch would sum them until a zero_grad reached them).

    One backward per ``step()`` (the engine updates the gradients as that backward completes them):
    a second forward with gradients before ``step()`` is refused; for accumulation, fp16 loss
    scaling or data parallel use ``tandem.Engine``.

    Args:
        params: parameters or param groups (dicts with "params" and any of lr, betas, eps,
            weight_decay), as torch.optim.AdamW; or the model.
        lr, betas, eps, weight_decay: the defaults of the groups, as torch.optim.AdamW.
        amsgrad, maximize: only False (ValueError otherwise). foreach, capturable, differentiable,
            fused: accepted and ignored (the engine has its own kernels).
        model: the module the parameters belong to (default: found).
        max_grad_norm: global-norm clipping before the update (0: none, as torch's AdamW).
        precision: "fp32", "bf16" or "fp16" working weights and autocast.
        config: further tandem config keys (see ``tandem.Engine``).
        blocks: the model's layers, when the automatic search should not choose them.
    """

    def __init__(self, params: Union[nn.Module, Iterable[Any]], lr: float = 1e-3,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2,
                 amsgrad: bool = False, *, maximize: bool = False, foreach: Optional[bool] = None,
                 capturable: bool = False, differentiable: bool = False, fused: Optional[bool] = None,
                 model: Optional[nn.Module] = None, max_grad_norm: float = 0.0, precision: str = "fp32",
                 config: Optional[Dict[str, Any]] = None, blocks: Optional[Sequence[nn.Module]] = None) -> None:
        if amsgrad or maximize:
            raise ValueError("OffloadAdamW has neither amsgrad nor maximize; use torch.optim.AdamW for them")
        if precision == "fp16":
            raise ValueError("OffloadAdamW has no loss scaling; use tandem.Engine with train.precision=fp16")
        if isinstance(params, nn.Module):
            model, params = params, [p for p in params.parameters() if p.requires_grad]
        self._engine: Optional[Engine] = None
        self._steps_before: List[int] = []  # per group: the engine's updates before the group's first
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        if model is None:
            model = _owner([p for g in self.param_groups for p in g["params"]])
        keys: Dict[str, Any] = {
            "offload.optimizer": "cpu", "optim.type": "adamw", "optim.lr": lr, "optim.beta1": betas[0],
            "optim.beta2": betas[1], "optim.eps": eps, "optim.weight_decay": weight_decay, "optim.decay_1d": True,
            "optim.schedule": "constant", "optim.warmup_steps": 0, "train.grad_clip": max_grad_norm,
            "train.precision": precision, "train.grad_accum": 1,
        }
        keys.update(config or {})
        self._engine = Engine(model, keys, blocks=blocks)
        if self._engine.world_size > 1:
            self._engine.close()
            raise ValueError("OffloadAdamW runs in one process; under torchrun use tandem.Engine and "
                             "engine.backward(loss), which weights each rank's share")
        self._model = model
        self._assign_groups()
        self._engine._attach.lr_source = self._groups_for_the_step

    @property
    def engine(self) -> Engine:
        """The engine under this optimizer (save, load, stats, close)."""
        if self._engine is None:
            raise ValueError("this OffloadAdamW is closed (opt.engine.close() ran); make a new one")
        return self._engine

    # Note [Parameter groups]: every trainable parameter of the model has a group in the engine; those
    # in none of this optimizer's get a last one with lr and weight decay 0, so they stay as they are.
    def _assign_groups(self) -> None:
        pairs, mine = [], set()
        for i, g in enumerate(self.param_groups):
            for p in g["params"]:
                pairs.append((p, i))
                mine.add(id(p))
        rest = len(self.param_groups)
        pairs += [(p, rest) for p in self._model.parameters() if p.requires_grad and id(p) not in mine]
        self.engine._live.assign_groups(pairs)

    def _groups_for_the_step(self) -> float:
        """At each forward that records gradients: the groups' current values go to the engine; the
        first group's lr is the step's (StepInfo.lr, the metrics)."""
        hypers = [(float(g["lr"]), float(g["betas"][0]), float(g["betas"][1]), float(g["eps"]),
                   float(g["weight_decay"]), self._steps_before[i]) for i, g in enumerate(self.param_groups)]
        last = self.param_groups[0]
        hypers.append((0.0, float(last["betas"][0]), float(last["betas"][1]), float(last["eps"]), 0.0, 0))
        self.engine._live.set_group_hypers(hypers)
        return float(self.param_groups[0]["lr"])

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        """As torch's: a group with its own hyper-parameters; its parameters (of the model, until
        now in no group) start with fresh moments."""
        super().add_param_group(param_group)
        if self._engine is None:  # torch's constructor adds the first groups
            self._steps_before.append(0)
            return
        self._steps_before.append(self.engine.global_step)  # its own steps count from here (bias correction)
        self._assign_groups()
        for p in self.param_groups[-1]["params"]:
            master, m, _ = self.engine._live.param_state(p)
            self.engine._live.load_param_state(p, master, torch.zeros_like(m), torch.zeros_like(m))

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None) -> Union[StepInfo, float, None]:  # type: ignore[override]
        """The update after ``loss.backward()``: clipping (max_grad_norm), AdamW, the new weights.
        Returns the closure's loss when there is a closure (as torch), else what the step did."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
            if isinstance(loss, torch.Tensor):
                self.engine._loss_sum = loss.detach().float()  # StepInfo.loss and the metrics row
        self.engine._live.end_backward()
        info = self.engine._finish_step()
        return loss if closure is not None else info

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing to do: the engine clears the gradients it has consumed (they live in its flat
        buffers, which the parameters' ``.grad`` are views of)."""

    def state_dict(self) -> Dict[str, Any]:
        """As torch's AdamW: "param_groups" and per parameter (numbered across the groups in order)
        its "step", "exp_avg" and "exp_avg_sq", plus its fp32 "master" (the engine's weights); before
        the first update, no state (as torch's). As torch's, the tensors are the live state, not
        copies: fp32 ones are views of the engine's buffers (on the host, or on the GPU for Blocks
        updated there), so saving a 7B model's state needs no second copy of it in memory; clone
        them to keep a snapshot while training goes on. accelerate (and so transformers' Trainer)
        moves an optimizer's state to the GPU when it prepares it: resume through the Trainer's
        resume_from_checkpoint, which loads the state after that."""
        packed = super().state_dict()
        if self.engine.global_step == 0:
            # Before the first update there is no state, as torch's AdamW has none: nothing to copy
            # for a wrapper that moves the state to the GPU (accelerate's, under the Trainer).
            return packed
        step = torch.tensor(float(self.engine.global_step))
        state, index = {}, 0
        for g, before in zip(self.param_groups, self._steps_before):
            for p in g["params"]:
                master, m, v = self.engine._live.param_state(p)
                state[index] = {"step": step - before, "exp_avg": m, "exp_avg_sq": v, "master": master}
                index += 1
        packed["state"] = state
        return packed

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """As torch's AdamW: the groups' hyper-parameters and each parameter's moments and step;
        the masters too when the state has them (this class's), else from the parameters."""
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups) or any(
                len(a["params"]) != len(b["params"]) for a, b in zip(groups, self.param_groups)):
            raise ValueError("the state's param groups do not match this optimizer's (their count or sizes differ)")
        params = [p for g in self.param_groups for p in g["params"]]
        for mine, saved in zip(self.param_groups, groups):
            mine.update({k: v for k, v in saved.items() if k != "params"})
        steps = []  # each group's count of updates, from its parameters' "step"
        index = 0
        for g in self.param_groups:
            group_step = 0
            for p in g["params"]:
                s = state_dict["state"].get(index)
                index += 1
                if s is None:
                    continue
                master = s.get("master", p.detach().float())
                self.engine._live.load_param_state(p, master, s["exp_avg"], s["exp_avg_sq"])
                group_step = max(group_step, int(float(s["step"])))
            steps.append(group_step)
        total = max(steps, default=0)
        self.engine._live.set_step(total)
        self._steps_before = [total - s for s in steps]
