"""Hugging Face model directories: config.json plus one or sharded ``*.safetensors`` files."""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

from radixlm.runtime.config import ModelConfig

if TYPE_CHECKING:
    import torch


def hf_config(path: str, overrides: dict | None = None) -> ModelConfig:
    """The model's ``config.json``, with the ``overrides`` fields replaced."""
    config_file = os.path.join(path, "config.json")
    if not os.path.isfile(config_file):
        raise FileNotFoundError(f"no config.json in model directory {path!r}")
    with open(config_file) as f:
        return ModelConfig.from_hf_dict({**json.load(f), **(overrides or {})})


def safetensors_files(path: str) -> list[str]:
    """The shards named by ``model.safetensors.index.json``, else every ``*.safetensors`` file."""
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        files = [os.path.join(path, s) for s in shards]
        missing = [f for f in files if not os.path.isfile(f)]
        if missing:
            raise FileNotFoundError(f"shards listed in {index} are missing: {missing}")
        return files
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in model directory {path!r}")
    return files


def safetensors_weights(files: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    for file in files:
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def safetensors_tensor_count(files: list[str]) -> int:
    from safetensors import safe_open

    total = 0
    for file in files:
        with safe_open(file, framework="pt") as f:
            total += len(list(f.keys()))
    return total
