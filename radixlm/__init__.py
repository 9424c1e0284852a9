"""radixlm: an LLM inference engine with a radix-tree KV cache and a frontend language."""

from __future__ import annotations

from radixlm.runtime.engine import Engine

__all__ = ["Engine"]
