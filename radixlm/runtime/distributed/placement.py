"""Where each process of a replica runs, checked before any is started: this module imports no
torch, so the server process (which only launches the others) never loads it."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

from radixlm.runtime.config import ModelConfig

# NOTE: models whose q/k norm spans every head (models/olmo.py), which heads split across ranks
# would change
WHOLE_QK_NORM = ("Olmo2ForCausalLM", "OlmoeForCausalLM")


@dataclass(frozen=True)
class RankInfo:
    """One scheduler process's place: tensor-parallel rank and size, and the GPU it uses."""

    tp_rank: int = 0
    tp_size: int = 1
    gpu_id: int = 0
    init_method: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def check_tp_size(config: ModelConfig, tp_size: int) -> None:
    """Raise ValueError unless the model's heads and MLP split evenly over ``tp_size`` ranks."""
    if tp_size == 1:
        return
    heads, kv = config.num_heads, config.num_kv_heads
    shape = f"the model has {heads} attention heads and {kv} KV heads"
    if heads % tp_size:
        raise ValueError(f"tp_size={tp_size} must divide the number of attention heads; {shape}")
    if kv % tp_size and tp_size % kv:
        raise ValueError(
            f"tp_size={tp_size} must divide the number of KV heads or be a multiple of it; {shape}"
        )
    if config.intermediate_size % tp_size:
        raise ValueError(f"tp_size={tp_size} must divide the MLP size ({config.intermediate_size})")
    for name in ("moe_intermediate_size", "shared_expert_intermediate_size"):
        size = getattr(config, name)
        if config.num_experts and size % tp_size:
            raise ValueError(f"tp_size={tp_size} must divide the experts' {name} ({size})")
    if config.architecture in WHOLE_QK_NORM:
        raise ValueError(
            f"{config.architecture} normalises the whole projected q and k across all heads: "
            f"it runs with tp_size=1 (got tp_size={tp_size})"
        )


def check_gpu_count(device: str, tp_size: int) -> None:
    """Raise ValueError when tensor parallelism on CUDA needs more GPUs than are visible."""
    if device not in ("auto", "cuda") or tp_size == 1:
        return
    import torch  # NOTE: only tensor parallelism on a GPU counts GPUs here

    if not torch.cuda.is_available():
        return
    count = torch.cuda.device_count()
    if tp_size > count:
        raise ValueError(f"tp_size={tp_size} needs {tp_size} GPUs, but {count} are visible")


def file_init_method(private_dir: str) -> str:
    """A ``file://`` rendezvous inside the runtime's private temporary directory."""
    return f"file://{os.path.join(private_dir, 'tp_init')}"
