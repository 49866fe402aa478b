"""Turning the ``config=`` argument into tandem's keys (the CLI's ``--set KEY=VALUE`` and files)."""

from __future__ import annotations

import os
from typing import Any, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from . import _C

ConfigArg = Union[None, str, "os.PathLike[str]", Mapping[str, Any], Sequence[Union[str, "os.PathLike[str]", Mapping[str, Any]]]]

__all__ = ["ConfigArg", "split_config", "config_values", "resolve_device"]


def _value_text(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    if isinstance(value, (list, tuple)):
        return ",".join(_value_text(key, v) for v in value)
    raise TypeError(f"config key '{key}': a {type(value).__name__} is not a config value; give a str, int, float or bool")


def split_config(config: ConfigArg) -> Tuple[List[str], List[Tuple[str, str]]]:
    """Files (YAML with tandem's keys, or a DeepSpeed JSON) and KEY=VALUE pairs, in the order given."""
    files: List[str] = []
    keys: List[Tuple[str, str]] = []
    items = [] if config is None else [config] if isinstance(config, (str, os.PathLike, Mapping)) else list(config)
    for item in items:
        if isinstance(item, Mapping):
            for k, v in item.items():
                if not isinstance(k, str):
                    raise TypeError(f"config keys are strings such as 'optim.lr'; got {k!r}")
                keys.append((k, _value_text(k, v)))
        elif isinstance(item, (str, os.PathLike)):
            path = os.fspath(item)
            if not os.path.isfile(path):
                raise ValueError(f"config file '{path}' does not exist; give a YAML file of tandem's keys or a DeepSpeed JSON")
            files.append(path)
        else:
            raise TypeError(
                f"config: a {type(item).__name__} is not a config; give a dict of keys, a YAML or DeepSpeed JSON path, "
                "or a list of those"
            )
    return files, keys


def config_values(files: List[str], keys: List[Tuple[str, str]], names: List[str]) -> List[str]:
    """The resolved values of `names`, the config read once (ValueError for an unknown key or a bad
    value)."""
    return list(_C.config_values(files, keys, names))


def resolve_device(setting: str) -> torch.device:
    """train.device as the C++ run context resolves it: auto = this rank's GPU when there is one.
    The setting is parsed by the C++ side (core/device_spec.h): anything but auto, cpu, cuda or
    cuda:N is a ValueError naming it."""
    return _C.run_device([], [("train.device", setting)])
