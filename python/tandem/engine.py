"""``tandem.Engine``: tandem's offload engine under the user's own model and training loop."""

from __future__ import annotations

import json
import os
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from . import _C
from .blocks import BlockSpec, find_blocks
from .config import ConfigArg, config_values, split_config

__all__ = ["Engine", "StepInfo"]

StepInfo = _C.StepInfo

def _cross(value: Any, device: str) -> Any:
    """Tensors inside `value` (tuples, lists, dicts) moved to `device` inside autograd."""
    if isinstance(value, torch.Tensor):
        return value if value.device == torch.device(device) else _C.cross_device(value, device)
    if isinstance(value, tuple):
        return type(value)(*(_cross(v, device) for v in value)) if hasattr(value, "_fields") else \
            tuple(_cross(v, device) for v in value)
    if isinstance(value, list):
        return [_cross(v, device) for v in value]
    if isinstance(value, dict):
        return {k: _cross(v, device) for k, v in value.items()}
    return value


class _Attachment:
    """The engine's hooks on the user's model (Note [Python engine] in src/tandem/python/engine_core.cpp):
    the model's forward opens the step, each Block's forward waits for its weights, and the forward
    runs under autocast in the configured precision."""

    def __init__(self, model: nn.Module, specs: List[BlockSpec], blocks: "_C.ModuleBlocks", device: torch.device,
                 autocast: Optional[torch.dtype]) -> None:
        self.model = model
        self.blocks = blocks
        self.device = device
        self.autocast = autocast
        self.core: Optional["_C.EngineCore"] = None
        self.lr_source = None  # callable giving the learning rate, or None for the config's schedule
        self.last_part: Optional[bool] = None  # train_step: whether this forward is the step's last
        self.tokens = 0  # tokens of the open step's forwards (for the metrics)
        self._entered: set = set()
        self._autocast_stack: List[Any] = []
        self._host_autocast: Dict[int, Any] = {}
        self._handles = [
            model.register_forward_pre_hook(self._root_pre, with_kwargs=True),
            model.register_forward_hook(self._root_post, with_kwargs=True, always_call=True),
        ]
        for i, spec in enumerate(specs):
            for module in spec.modules:
                self._handles.append(module.register_forward_pre_hook(self._block_pre(i), with_kwargs=True))
            if spec.kind == _C.BlockKind.LAYER:
                self._handles.append(spec.modules[0].register_forward_hook(self._block_post(i), always_call=True))

    def _block_pre(self, i: int):
        def hook(module: nn.Module, args: Any, kwargs: Dict[str, Any]) -> Any:
            # Once per forward (an edge Block's parameters sit in several modules); a layer
            # recomputed in backward (checkpointing) already has its weights.
            if i not in self._entered:
                self._entered.add(i)
                self.blocks.before_block(i)
            if not self.blocks.host_block(i):
                return None
            # Note [Block placement]: this Block runs on the host; its inputs cross inside autograd.
            if self.autocast is not None:
                ctx = torch.autocast("cpu", dtype=self.autocast)
                ctx.__enter__()
                self._host_autocast[i] = ctx
            return _cross(args, "cpu"), _cross(kwargs, "cpu")
        return hook

    def _block_post(self, i: int):
        def hook(module: nn.Module, args: Any, output: Any) -> Any:
            ctx = self._host_autocast.pop(i, None)
            if ctx is not None:
                ctx.__exit__(None, None, None)
            if not self.blocks.host_block(i) or self.device.type == "cpu":
                return None
            return _cross(output, str(self.device))
        return hook

    def _check_inputs(self, args: Sequence[Any], kwargs: Dict[str, Any]) -> None:
        named = [(f"argument {j}", a) for j, a in enumerate(args)] + list(kwargs.items())
        for name, value in named:
            if isinstance(value, torch.Tensor) and value.device.type != self.device.type:
                raise TypeError(
                    f"{name} of the model's forward is on {value.device}, but the engine trains on {self.device}; "
                    f"move the batch there first (tensor.to(engine.device))"
                )
            if isinstance(value, torch.Tensor) and value.dtype == torch.long and name in ("input_ids", "argument 0"):
                self.tokens += value.numel()

    def _root_pre(self, module: nn.Module, args: Any, kwargs: Dict[str, Any]) -> None:
        self._check_inputs(args, kwargs)
        self._entered = set()
        if self.core is not None and torch.is_grad_enabled():
            lr = self.lr_source() if self.lr_source is not None else None
            self.core.begin_forward(lr, self.last_part)
        if self.autocast is not None:
            ctx = torch.autocast(self.device.type, dtype=self.autocast)
            ctx.__enter__()
            self._autocast_stack.append(ctx)

    def _root_post(self, module: nn.Module, args: Any, kwargs: Dict[str, Any], output: Any) -> None:
        if self._autocast_stack:
            self._autocast_stack.pop().__exit__(None, None, None)

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


class Engine:
    """Trains the user's ``nn.Module`` with tandem's engine, from the user's own loop.

    With ``offload.optimizer=cpu`` the fp32 master weights and AdamW states live in (pinned) host
    memory, the model's parameters become views of compute-dtype working copies on the device,
    gradients stream to the CPU Block by Block while backward runs, the CPU updates overlap the
    backward, and the first Blocks (the update split k, solved at run time) are updated on the GPU.
    Without it the model trains on the device with a fused AdamW, as a plain PyTorch loop would.

    The learning rate follows the config's schedule (optim.lr, optim.warmup_steps, optim.schedule,
    decaying over train.steps as ``tandem train`` does): set ``train.steps`` to the loop's length,
    or ``optim.schedule=constant``. With several processes each rank's loss is weighted as one
    equal share of the global batch.

    Example::

        engine = tandem.Engine(model, config={"offload.optimizer": "cpu", "optim.lr": 3e-4,
                                              "train.precision": "bf16"})
        for batch in loader:
            loss = model(**batch).loss
            engine.backward(loss)
            engine.step()
        engine.save("ckpt/")

    Args:
        model: any ``nn.Module``. Its Blocks are its repeated layers (found automatically, or
            ``blocks``); the parameters outside them form the embedding and head Blocks.
        config: tandem's config keys (``tandem config --keys``) as a dict, a YAML file of them,
            a DeepSpeed JSON config, or a list of those applied in order.
        blocks: the model's layers, when the automatic search should not choose them.
        edge_blocks: False requires every trainable parameter to be inside ``blocks``.
        run_dir: where checkpoints, ``metrics.jsonl`` and ``trace.json`` go (default: train.run_dir,
            else ``runs/<time>-python``).

    Raises:
        ValueError: an unknown key or bad value, a model without repeated layers, a parameter in
            two Blocks, a memory plan that cannot fit; one line naming the cause and the fix.
        TypeError: a config or blocks argument of the wrong type.
    """

    def __init__(self, model: nn.Module, config: ConfigArg = None, *, blocks: Optional[Sequence[nn.Module]] = None,
                 edge_blocks: bool = True, run_dir: Optional[str] = None) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"tandem.Engine takes an nn.Module; got a {type(model).__name__}")
        files, keys = split_config(config)
        self._files, self._keys = files, keys
        self.model = model
        offload, config_run_dir = config_values(files, keys, ["offload.optimizer", "train.run_dir"])
        self.device = _C.run_device(files, keys)  # as the CLI's run context picks it
        self._offload = offload == "cpu"
        self.run_dir = run_dir or config_run_dir or _C.new_run_dir("python")
        specs = find_blocks(model, blocks, edge_blocks)
        self._place_model(specs)
        self._blocks = _C.ModuleBlocks([(s.name, s.kind, s.params) for s in specs])
        self._attach = _Attachment(model, specs, self._blocks, self.device, _C.autocast_dtype(files, keys))
        try:
            self._core = _C.EngineCore(self._blocks, files, keys, self.run_dir)
        except BaseException:
            self._attach.detach()
            raise
        self._attach.core = self._core
        self.run_dir = self._core.run_dir()
        # The persistent buffers (BatchNorm's running statistics, ...) go into checkpoints beside the weights.
        persistent = set(model.state_dict(keep_vars=True).keys())
        self._core.set_buffers([(n, b) for n, b in model.named_buffers() if b is not None and n in persistent])
        if self.device.type == "cpu":
            self._warn_gpu_only_keys(keys)
        self._loss_sum: Optional[torch.Tensor] = None

    # Keys that shape only the GPU's side (its transfers, its memory tier, its matmul numerics): with the
    # CPU as the device they change nothing. (offload.delayed_update and offload.host_ring do change a
    # CPU run: the CPU-updated Blocks' lag and buffers.)
    _GPU_ONLY = ("offload.pin_memory", "offload.gpu_memory_fraction", "train.tf32")

    @staticmethod
    def _warn_gpu_only_keys(keys: Sequence[Tuple[str, str]]) -> None:
        for key, _ in keys:
            if key in Engine._GPU_ONLY:
                warnings.warn(f"{key} does nothing with the CPU as the device (it shapes the GPU's side); it is "
                              "ignored here", stacklevel=3)

    def _place_model(self, specs: List[BlockSpec]) -> None:
        """Offload: the trainable parameters stay where they are (they become the host masters);
        buffers and frozen parameters move to the device. Otherwise the whole model moves."""
        if not self._offload:
            self.model.to(self.device)
            return
        trainable = {id(p) for s in specs for _, p in s.params}
        with torch.no_grad():
            for module in self.model.modules():
                for name, buf in list(module._buffers.items()):
                    if buf is not None:
                        module._buffers[name] = buf.to(self.device)
                for name, p in list(module._parameters.items()):
                    if p is not None and id(p) not in trainable:
                        p.data = p.data.to(self.device)

    # The loop.
    def backward(self, loss: torch.Tensor) -> None:
        """Backward of one micro-batch's loss. Gradients are weighted for accumulation
        (train.grad_accum), the data-parallel ranks and the fp16 loss scale; on the step's last
        micro-batch they stream to the CPU Block by Block while backward runs."""
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"engine.backward takes the loss tensor; got a {type(loss).__name__}")
        if loss.dim() != 0:
            raise ValueError(f"the loss has shape {tuple(loss.shape)}; reduce it to a scalar (loss.mean()) first")
        if not loss.requires_grad:
            raise ValueError("the loss does not require grad; compute it from the model's output with gradients on")
        self._backward(loss, 1.0)

    def _backward(self, loss: torch.Tensor, share: float) -> None:
        (loss * (self._live.loss_multiplier() * share)).backward()
        self._live.end_backward()
        detached = loss.detach().float() * share
        self._loss_sum = detached if self._loss_sum is None else self._loss_sum + detached

    def train_step(self, loss_fn: Callable[..., torch.Tensor], *batch: torch.Tensor) -> StepInfo:
        """A whole step over this rank's rows of ``batch`` (tensors sharing their first dimension):
        train.grad_accum micro-batches, ``loss_fn(*rows)`` each, backward, then the update.

        Out of memory in a forward or backward (Note [Adaptive micro-batch], as ``tandem train``):
        the step is given up, and run again from its first row with each micro-batch cut into
        twice as many parts, each part's loss weighted by its share of the rows, so the step sees
        the same samples with the same weights. After train.oom_grow_after clean steps the parts
        halve again. ValueError when even one row does not fit (or train.oom_retry is off).
        """
        rows = int(batch[0].shape[0])
        accumulation = self._live.accumulation()
        if any(int(t.shape[0]) != rows for t in batch) or rows < accumulation:
            raise ValueError(f"train_step: the batch's tensors must share a first dimension of at least "
                             f"train.grad_accum={accumulation} rows")
        micro_rows = -(-rows // accumulation)  # the rows of one micro-batch, rounded up
        while True:
            pieces = min(accumulation * self._live.parts(micro_rows), rows)
            try:
                for p in range(pieces):
                    r0, r1 = rows * p // pieces, rows * (p + 1) // pieces
                    self._attach.last_part = p + 1 == pieces
                    loss = loss_fn(*(t[r0:r1] for t in batch))
                    self._backward(loss, accumulation * (r1 - r0) / rows)
                break
            except torch.OutOfMemoryError as e:
                what = str(e).splitlines()[0] if str(e) else "out of memory"
                self._loss_sum = None
                self._attach.tokens = 0
                self._live.retry_smaller(what, micro_rows)  # ValueError when it cannot be cut further
            finally:
                self._attach.last_part = None
        return self._finish_step()

    @property
    def oom_retries(self) -> int:
        """Steps run again after an out-of-memory error (train_step)."""
        return self._live.oom_retries()

    def step(self) -> Optional[StepInfo]:
        """The optimizer step at the accumulation boundary (every train.grad_accum backward calls;
        None before it): global-norm clipping, the non-finite check, AdamW on the CPU and the GPU."""
        if self._live.micro() < self._live.accumulation():
            if self._live.micro() == 0:
                raise ValueError("engine.step() without engine.backward(loss) since the last step")
            return None
        return self._finish_step()

    def abandon_step(self) -> None:
        """Gives up the open step (after an out-of-memory error in the forward or backward): nothing
        is updated, gradients are cleared, the device cache is freed; run the step again, e.g. with
        half the micro-batch and twice the accumulation."""
        self._live.abandon()
        self._loss_sum = None
        self._attach.tokens = 0

    # Checkpoints.
    def save(self, path: Optional[str] = None) -> str:
        """Writes a checkpoint in the CLI's format under ``path`` (a run directory; default
        ``run_dir``): ``checkpoints/step_XXXXXXXX/`` with model.safetensors (fp32 masters, HF names),
        config.json (a transformers model's), optimizer.safetensors, the RNG and the step.
        Returns the checkpoint's directory (on rank 0)."""
        hf = getattr(self.model, "config", None)
        hf_config = hf.to_json_string() if hasattr(hf, "to_json_string") else ""
        return self._live.save(os.fspath(path or self.run_dir), hf_config)

    def load(self, path: str) -> str:
        """Resumes exactly from a checkpoint directory, or the newest intact one in a run
        directory: weights, AdamW states, step, loss scale and RNG. Returns the checkpoint used."""
        return self._live.load(os.fspath(path))

    def wait(self) -> None:
        """Blocks until every update is in the model's weights (before evaluation or export)."""
        self._live.wait()

    # What it is doing.
    @property
    def global_step(self) -> int:
        """Optimizer steps completed."""
        return self._live.step()

    @property
    def data_position(self) -> int:
        """Micro-batches trained since the start (restored by load()): where a resumed loop's data
        continues, e.g. ``TokenBatches.seek(engine.data_position)``."""
        return self._live.data_position()

    @property
    def rank(self) -> int:
        """This process's rank (0 without torchrun or tandem launch)."""
        return self._live.rank()

    @property
    def world_size(self) -> int:
        """The number of data-parallel processes."""
        return self._live.world()

    def stats(self) -> Dict[str, Any]:
        """The engine's counters: steps, skipped steps, rollbacks, CPU update and transfer seconds,
        the update split."""
        return json.loads(self._live.stats_json())

    def config_yaml(self) -> str:
        """Every key as this engine resolved it (YAML)."""
        return self._live.config_yaml()

    @property
    def _live(self) -> "_C.EngineCore":
        """The engine's core; ValueError once close() has run."""
        core = getattr(self, "_core", None)
        if core is None:
            raise ValueError("this engine is closed (engine.close() ran); make a new tandem.Engine, or "
                             "tandem.optim.OffloadAdamW, to train on")
        return core

    def close(self) -> None:
        """Finishes the last updates, writes summary.json and removes the engine's hooks from the model."""
        if getattr(self, "_core", None) is not None:
            self._core.wait()
            self._core.finish_run()  # summary.json, the live endpoints stopped
            self._attach.detach()
            self._core = None

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _finish_step(self) -> StepInfo:
        """The update, with this step's loss and tokens for its metrics row (metrics.jsonl, the
        dashboard and /metrics, TensorBoard: the CLI's Note [Telemetry])."""
        accumulation = max(1, self._live.accumulation())
        loss = self._loss_sum / accumulation if self._loss_sum is not None else None
        info = self._live.update(loss, self._attach.tokens)
        self._loss_sum = None
        self._attach.tokens = 0
        return info
