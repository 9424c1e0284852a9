"""Find, configure and load a model: HF directory, GGUF file, or random weights."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
from tqdm import tqdm

from radixlm.kernels import cpu_ops
from radixlm.runtime.config import ModelConfig, ServerArgs
from radixlm.runtime.loader import gguf_loader, safetensors_loader
from radixlm.runtime.loader.model_files import load_config, load_tokenizer
from radixlm.runtime.models import gguf_quant
from radixlm.runtime.models.registry import get_model_class

logger = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    model: torch.nn.Module
    config: ModelConfig
    tokenizer: Any
    model_path: str
    four_bit_checkpoint: bool = False
    gguf_blocks: bool = False  # weights kept in their GGUF blocks (models/gguf_quant.py)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name != "auto":
        return getattr(torch, name)
    if device.type == "cuda" or cpu_has_fast_bf16():
        return torch.bfloat16
    return torch.float32


def cpu_has_fast_bf16() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def load_model(
    args: ServerArgs,
    device: torch.device,
    dtype: torch.dtype,
    on_loaded: Callable[[torch.nn.Module, str], None] | None = None,
) -> LoadedModel:
    """Build the model for ``args`` on ``device`` and fill its weights, showing progress;
    ``on_loaded(model, name)`` runs as each parameter is filled (see ``load_weights``)."""
    config, path, fmt = load_config(args)
    model_cls = get_model_class(config.architecture)
    # NOTE: importing transformers and loading the tokenizer take seconds of Python; on a
    # thread they overlap the weights, whose torch ops release the GIL (SmolLM2's load phase,
    # with the torch dequantisation: 5.5 -> 2.5 s).
    with ThreadPoolExecutor(1, thread_name_prefix="tokenizer") as pool:
        pending = pool.submit(load_tokenizer, args, path, fmt)
        torch.manual_seed(args.random_seed)
        # NOTE: built on "meta", then given storage where it will run, in its dtype, untouched
        # until each tensor is copied in: no random init for the checkpoint to overwrite, an 8B
        # model never in float32 on the host, and weights converted as they load (on_loaded)
        # never all exist at once. Checkpoint tensors are cast and moved as they are copied.
        with torch.device("meta"), _default_dtype(dtype):
            model = model_cls(config)
        model.to_empty(device=device).tie_weights()
        blocks = _keep_gguf_blocks(model, args, device, path, fmt, dtype)
        if args.load_format == "dummy":
            _init_dummy(model)
        else:
            weights = _weights(path, fmt, config, dtype, blocks)
            model.load_weights(_progress(weights, path, fmt, len(blocks)), on_loaded)
        tokenizer = pending.result()
    eos = set(config.eos_token_ids) | ({getattr(tokenizer, "eos_token_id", None)} - {None})
    config = config.with_overrides(eos_token_ids=tuple(sorted(eos)))
    four_bit = (fmt == "gguf" and args.quantization == "auto" and device.type == "cpu" and not
                blocks and gguf_loader.is_four_bit(gguf_loader.open_gguf(path)))  # fmt: skip
    return LoadedModel(model.eval(), config, tokenizer, path, four_bit, bool(blocks))


def _keep_gguf_blocks(model, args: ServerArgs, device, path: str, fmt: str, dtype) -> set[str]:
    """With ``quantization='gguf'`` (or 'auto' and a file :func:`gguf_quant.worth_it` picks),
    put the GGUF file's blocks in the model (models/gguf_quant.py); the tensor names taken."""
    if args.quantization == "gguf" and fmt != "gguf":
        raise ValueError(f"quantization='gguf' needs a GGUF file, got {path!r} ({fmt})")
    if fmt != "gguf" or args.quantization not in ("auto", "gguf") or args.load_format == "dummy":
        return set()
    reader = gguf_loader.open_gguf(path)
    if args.quantization == "auto":
        if device.type != "cpu" or args.tp_size > 1 or not gguf_quant.worth_it(reader, dtype):
            return set()
        if not cpu_ops.load():
            logger.warning("GGUF kernels unavailable: %s is dequantised at load", path)
            return set()
    elif device.type != "cpu" or args.tp_size > 1 or not cpu_ops.load():
        raise ValueError(
            "quantization='gguf' runs on CPU without tensor parallelism, with the C++ kernels "
            f"built (device {device.type}, tp_size {args.tp_size}, kernels {cpu_ops.loaded()})"
        )
    taken = gguf_quant.attach(model, reader, dtype)
    logger.info("GGUF blocks kept for %d tensors: %s", len(taken), gguf_quant.bytes_by_type(model))
    return taken


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _weights(path: str, fmt: str, config: ModelConfig, dtype: torch.dtype, skip: set[str]):
    if fmt == "gguf":
        reader = gguf_loader.open_gguf(path)
        return gguf_loader.gguf_weights(reader, config, dtype, frozenset(skip))
    return safetensors_loader.safetensors_weights(safetensors_loader.safetensors_files(path))


def _progress(weights, path: str, fmt: str, skipped: int = 0):
    if fmt == "gguf":
        total = len(gguf_loader.open_gguf(path).tensors) - skipped
    else:
        total = safetensors_loader.safetensors_tensor_count(
            safetensors_loader.safetensors_files(path)
        )
    desc = f"loading {os.path.basename(path.rstrip('/'))}"
    return tqdm(weights, total=total, desc=desc, unit="tensor", leave=False)


def _init_dummy(model: torch.nn.Module) -> None:
    """Random weights with a small spread, so activations stay finite at any depth."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.uniform_(-0.02, 0.02)
