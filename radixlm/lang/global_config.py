"""The language's process-wide settings: the default backend and prefix caching."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class GlobalConfig:
    """``default_backend`` is what ``set_default_backend`` sets; ``run_batch`` caches a traced
    constant prefix of at least ``precache_min_chars`` characters when precaching is on."""

    default_backend: Any = None
    enable_precache_with_tracing: bool = True
    precache_min_chars: int = 64


# NOTE: the one piece of module-level state in the language, as in SGLang's set_default_backend.
global_config = GlobalConfig()
