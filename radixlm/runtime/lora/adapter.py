"""Reading a peft LoRA adapter directory (``adapter_config.json`` + ``adapter_model.safetensors``)
into per-projection low-rank pairs, checked against the model they will run on.

A peft module (``model.layers.3.self_attn.k_proj``) maps onto one of our projections and, for
the fused ones, a row range of it (``layers.3.self_attn.qkv_proj``, the k rows). The scaling
(``alpha / r``, or ``alpha / sqrt(r)`` with rsLoRA) is folded into B."""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass

import torch

CONFIG_FILE = "adapter_config.json"
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
_KEY = re.compile(r"^(?:base_model\.model\.)?(.+)\.lora_([AB])(?:\.default)?\.weight$")


@dataclass(frozen=True)
class TargetShape:
    """One projection LoRA may adapt: its input width and the row count of each of its shards
    (q, k, v for ``qkv_proj``; gate, up for ``gate_up_proj``; one for the others)."""

    in_features: int
    shards: tuple[int, ...]

    @property
    def out_features(self) -> int:
        return sum(self.shards)


@dataclass(frozen=True)
class LoraPair:
    """``B @ A`` for shard ``shard`` of a projection (-1: all of it, for a checkpoint whose own
    module is fused); ``b`` already carries the scaling."""

    shard: int
    a: torch.Tensor  # [r, in]
    b: torch.Tensor  # [shard rows, r]


@dataclass(frozen=True)
class LoraWeights:
    name: str
    path: str
    rank: int  # the largest rank of any of its modules
    pairs: dict[str, list[LoraPair]]  # our projection's module name -> its pairs


def read_adapter(
    name: str, path: str, model, targets: dict[str, TargetShape], max_rank: int
) -> LoraWeights:
    """Load and check the adapter at ``path``; ValueError naming what is wrong (a missing or
    malformed directory, a rank above ``max_rank``, a module the model lacks, a shape)."""
    config = _read_config(name, path)
    tensors = _read_tensors(name, path)
    found: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        m = _KEY.match(key)
        if m is None:
            raise ValueError(
                f"LoRA adapter {name!r}: tensor {key!r} is not a LoRA A/B weight "
                "(embedding LoRA, DoRA and modules_to_save are not supported)"
            )
        found.setdefault(m.group(1), {})[m.group(2)] = tensor
    if not found:
        raise ValueError(f"LoRA adapter {name!r}: {path} holds no LoRA weights")
    pairs: dict[str, list[LoraPair]] = {}
    rank = 0
    for module, ab in sorted(found.items()):
        if set(ab) != {"A", "B"}:
            raise ValueError(f"LoRA adapter {name!r}: module {module!r} lacks lora_A or lora_B")
        ours, shard = _our_module(model, module)
        if ours not in targets:
            raise ValueError(
                f"LoRA adapter {name!r}: target module {module!r} does not exist in this model "
                f"(LoRA applies to q/k/v/o_proj and the dense MLP's gate/up/down_proj)"
            )
        a, b = ab["A"].float(), ab["B"].float()
        r = a.shape[0]
        if r > max_rank:
            raise ValueError(
                f"LoRA adapter {name!r}: module {module!r} has rank {r}, above "
                f"max_lora_rank {max_rank} (start with --max-lora-rank {r})"
            )
        shape = targets[ours]
        rows = shape.out_features if shard < 0 else shape.shards[shard]
        want_a, want_b = (r, shape.in_features), (rows, r)
        if tuple(a.shape) != want_a or tuple(b.shape) != want_b:
            raise ValueError(
                f"LoRA adapter {name!r}: module {module!r} has A {tuple(a.shape)} and B "
                f"{tuple(b.shape)}; this model needs {want_a} and {want_b}"
            )
        scale = _scaling(config, module, r)
        pairs.setdefault(ours, []).append(LoraPair(shard, a.contiguous(), (b * scale).contiguous()))
        rank = max(rank, r)
    return LoraWeights(name, path, rank, pairs)


def _read_config(name: str, path: str) -> dict:
    file = os.path.join(path, CONFIG_FILE)
    if not os.path.isdir(path):
        raise ValueError(f"LoRA adapter {name!r}: {path!r} is not a directory")
    try:
        with open(file) as f:
            config = json.load(f)
    except OSError as e:
        raise ValueError(f"LoRA adapter {name!r}: cannot read {file}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"LoRA adapter {name!r}: {file} is not valid JSON: {e}") from None
    if not isinstance(config, dict) or config.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"LoRA adapter {name!r}: {file} is not a LoRA adapter config")
    if config.get("use_dora"):
        raise ValueError(f"LoRA adapter {name!r}: DoRA adapters are not supported")
    if config.get("bias", "none") != "none":
        raise ValueError(f"LoRA adapter {name!r}: bias={config['bias']!r} is not supported")
    for key in ("r", "lora_alpha"):
        if not isinstance(config.get(key), (int, float)) or config[key] <= 0:
            raise ValueError(f"LoRA adapter {name!r}: {file} needs a positive {key!r}")
    return config


def _read_tensors(name: str, path: str) -> dict[str, torch.Tensor]:
    for file in WEIGHT_FILES:
        full = os.path.join(path, file)
        if not os.path.exists(full):
            continue
        try:
            if file.endswith(".safetensors"):
                from safetensors.torch import load_file

                return load_file(full)
            return torch.load(full, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001  (any unreadable file is the user's to fix)
            raise ValueError(f"LoRA adapter {name!r}: cannot read {full}: {e}") from None
    raise ValueError(f"LoRA adapter {name!r}: {path} has none of {', '.join(WEIGHT_FILES)}")


def _our_module(model, module: str) -> tuple[str, int]:
    """Our projection for peft module ``module`` and the shard of it the module is."""
    name = module.removeprefix("model.")
    for frag, ours in model.renames:
        name = name.replace(frag, ours)
    head, _, leaf = name.rpartition(".")
    fused = model.stacked.get(leaf)
    if fused is None:
        return name, -1
    return f"{head}.{fused[0]}", fused[1]


def _scaling(config: dict, module: str, r: int) -> float:
    """peft's: ``alpha / r`` (``alpha / sqrt(r)`` with rsLoRA), alpha from ``alpha_pattern``
    where one of its keys names the module."""
    alpha = config["lora_alpha"]
    for pattern, value in (config.get("alpha_pattern") or {}).items():
        if re.fullmatch(rf"(.*\.)?{pattern}", module):
            alpha = value
            break
    return alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r
