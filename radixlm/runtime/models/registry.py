"""Architecture name (as in config.json ``architectures``) -> model class."""

from __future__ import annotations

from collections.abc import Callable

from radixlm.runtime.models.architectures import check_architecture

MODELS: dict[str, type] = {}


def register_model(*names: str) -> Callable[[type], type]:
    def wrap(cls: type) -> type:
        for name in names:
            MODELS[name] = cls
        return cls

    return wrap


def get_model_class(architecture: str) -> type:
    from radixlm.runtime.models import (  # noqa: F401  (importing a family registers it)
        gemma,
        granite,
        llama,
        mixtral,
        olmo,
        phi3,
        qwen2,
        qwen_moe,
        smollm3,
    )

    check_architecture(architecture)
    return MODELS[architecture]
