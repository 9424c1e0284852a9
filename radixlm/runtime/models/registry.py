"""Architecture name (as in config.json ``architectures``) -> model class."""

from __future__ import annotations

from collections.abc import Callable

MODELS: dict[str, type] = {}


def register_model(*names: str) -> Callable[[type], type]:
    def wrap(cls: type) -> type:
        for name in names:
            MODELS[name] = cls
        return cls

    return wrap


def supported_architectures() -> list[str]:
    get_model_class("LlamaForCausalLM")
    return sorted(MODELS)


def get_model_class(architecture: str) -> type:
    from radixlm.runtime.models import (  # noqa: F401  (importing a family registers it)
        gemma, granite, llama, mixtral, olmo, phi3, qwen2, qwen_moe, smollm3,
    )

    if architecture not in MODELS:
        raise ValueError(f"unsupported architecture {architecture!r}; supported: {sorted(MODELS)}")
    return MODELS[architecture]
