"""radixlm: an LLM inference engine with a radix-tree KV cache and a frontend language.

The public names are loaded on first use, so that ``import radixlm.kernels`` (the GPU checks)
does not pull in the runtime's process and server dependencies.
"""

from __future__ import annotations

import importlib
from typing import Any

_LANG = (
    "REGEX_BOOL", "REGEX_FLOAT", "REGEX_INT", "REGEX_STR", "OpenAI", "ProgramError", "Runtime",
    "RuntimeEndpoint", "assistant", "assistant_begin", "assistant_end", "flush_cache", "function",
    "gen", "gen_int", "gen_string", "get_server_info", "greedy_token_selection", "select",
    "set_default_backend", "system", "system_begin", "system_end", "token_length_normalized",
    "tools_prompt", "unconditional_likelihood_normalized", "user", "user_begin", "user_end",
    "global_config", "image", "video", "separate_reasoning",
)  # fmt: skip
_HOMES = {**{name: "radixlm.lang" for name in _LANG}, "Engine": "radixlm.runtime.engine"}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'radixlm' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
