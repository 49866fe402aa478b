"""Finding a model's Blocks: the unit the engine streams, updates, places and checkpoints.

A Block is a group of parameters (Note [Block sequence] in docs/architecture.md). The repeated
layers of a model are found automatically: the ``nn.ModuleList`` holding the most parameters whose
children are all of one class (transformers' ``model.layers``, nanoGPT's ``transformer.h``). The
parameters outside them form the edge Blocks: those registered before the first layer the
embedding Block, the rest the head Block. A weight tied between two modules is one parameter and
belongs to the first Block that registers it. Frozen layers (no trainable parameter) are no Blocks; a
model without repeated layers is one Block; a layer shared by several depths (ALBERT) is one Block,
whose forward runs several times a step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch
from torch import nn

from . import _C

__all__ = ["BlockSpec", "find_blocks", "find_layers"]


@dataclass
class BlockSpec:
    """One Block: its display name, its role, its parameters (checkpoint name, tensor) and the
    modules whose forward uses them first (where the engine waits for the Block's weights)."""

    name: str
    kind: "_C.BlockKind"
    params: List[Tuple[str, nn.Parameter]] = field(default_factory=list)
    modules: List[nn.Module] = field(default_factory=list)


def find_layers(model: nn.Module) -> List[nn.Module]:
    """The model's repeated layers: the children of the ``nn.ModuleList`` with the most parameters
    whose children (at least two) are all of one class.

    Raises ValueError naming the fix when the model has no such list.
    """
    best: Optional[nn.ModuleList] = None
    best_numel = 0
    for module in model.modules():
        if not isinstance(module, nn.ModuleList) or len(module) < 2:
            continue
        if len({type(child) for child in module}) != 1:
            continue
        numel = sum(p.numel() for p in module.parameters() if p.requires_grad)
        if numel > best_numel:
            best, best_numel = module, numel
    if best is None:
        raise ValueError(
            f"{type(model).__name__} has no repeated layers (an nn.ModuleList of at least two modules of one "
            "class, with trainable parameters); name its Blocks: tandem.Engine(model, blocks=[...])"
        )
    return list(best)


def _trainable(model: nn.Module) -> Dict[int, Tuple[int, str, nn.Parameter]]:
    """id(parameter) -> (registration order, name, parameter), each tensor once (tied weights once)."""
    out: Dict[int, Tuple[int, str, nn.Parameter]] = {}
    for order, (name, p) in enumerate(model.named_parameters()):
        if p.requires_grad:
            out[id(p)] = (order, name, p)
    return out


def _owner_modules(model: nn.Module, params: Iterable[nn.Parameter]) -> List[nn.Module]:
    """The modules that own any of `params` directly, in registration order."""
    wanted = {id(p) for p in params}
    return [m for m in model.modules() if any(id(p) in wanted for p in m.parameters(recurse=False))]


def find_blocks(
    model: nn.Module, blocks: Optional[Sequence[nn.Module]] = None, edge_blocks: bool = True
) -> List[BlockSpec]:
    """The model's Blocks in forward order: the embedding Block, one per layer, the head Block.

    Args:
        model: the user's model.
        blocks: the layers, when the automatic search (``find_layers``) is not wanted.
        edge_blocks: put the parameters outside the layers into the embedding and head Blocks;
            with False every trainable parameter must be inside a given layer.

    Raises ValueError for a parameter in two Blocks, a parameter in no Block (``edge_blocks=False``),
    or a model without repeated layers.
    """
    named = blocks is not None
    if not named:
        try:
            layers = find_layers(model)
        except ValueError:
            # No repeated layers (an MLP, ALBERT's one layer shared by every depth): the model is one
            # Block. It trains as any other, without overlapping layers' updates with the backward.
            layers = [model]
    else:
        layers = list(blocks)
        for i, layer in enumerate(layers):
            if not isinstance(layer, nn.Module):
                raise TypeError(f"blocks[{i}] is a {type(layer).__name__}; give nn.Module objects (the model's layers)")
    trainable = _trainable(model)
    taken: Dict[int, str] = {}
    specs: List[BlockSpec] = []
    first_layer_order = None
    for i, layer in enumerate(layers):
        spec = BlockSpec(f"layer.{i}", _C.BlockKind.LAYER, modules=[layer])
        for p in layer.parameters():
            if id(p) not in trainable:
                continue
            if id(p) in taken:
                order, name, _ = trainable[id(p)]
                raise ValueError(
                    f"parameter '{name}' is in two Blocks ({taken[id(p)]} and {spec.name}); give each layer once "
                    "in blocks=[...] and no module inside another"
                )
            taken[id(p)] = spec.name
            order, name, _ = trainable[id(p)]
            spec.params.append((name, p))
            first_layer_order = order if first_layer_order is None else min(first_layer_order, order)
        if not spec.params:
            if named:
                raise ValueError(f"blocks[{i}] ({type(layer).__name__}) has no trainable parameters; leave it out")
            continue  # a frozen layer (fine-tuning the rest): no Block, it stays as it is
        specs.append(spec)
    rest = sorted((v for k, v in trainable.items() if k not in taken), key=lambda v: v[0])
    if rest and not edge_blocks:
        raise ValueError(
            f"parameter '{rest[0][1]}' is in no Block; add its module to blocks=[...] or let the edge Blocks take it "
            "(edge_blocks=True)"
        )
    before = [(name, p) for order, name, p in rest if first_layer_order is not None and order < first_layer_order]
    after = [(name, p) for order, name, p in rest if first_layer_order is None or order >= first_layer_order]
    out: List[BlockSpec] = []
    if before:
        out.append(BlockSpec("embed", _C.BlockKind.EMBEDDING, before, _owner_modules(model, [p for _, p in before])))
    out.extend(specs)
    if after:
        out.append(BlockSpec("head", _C.BlockKind.HEAD, after, _owner_modules(model, [p for _, p in after])))
    return out
