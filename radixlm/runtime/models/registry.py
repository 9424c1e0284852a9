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


def get_model_class(architecture: str) -> type:
    from radixlm.runtime.models import llama, qwen2  # noqa: F401  (registers)

    if architecture not in MODELS:
        raise ValueError(f"unsupported architecture {architecture!r}; supported: {sorted(MODELS)}")
    return MODELS[architecture]
