"""The interface every backend of the language implements."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from radixlm.lang.chat_template import ChatTemplate, get_chat_template

if TYPE_CHECKING:
    from radixlm.lang.choices import ChoicesDecision, ChoicesSamplingMethod
    from radixlm.lang.executor import StreamExecutor
    from radixlm.lang.ir import SglSamplingParams


class BaseBackend:
    """Where a program's ``gen`` and ``select`` run.

    ``generate`` returns ``(text, meta_info)`` (a list of texts and metas when ``n > 1``);
    ``generate_stream`` yields ``(text_delta, meta_info)``; ``select`` returns a decision.
    """

    is_chat_model = False
    supports_images = False  # whether ``sgl.image`` inputs reach the model

    def __init__(self, chat_template: ChatTemplate | None = None) -> None:
        self.chat_template = chat_template or get_chat_template("default")

    def get_model_name(self) -> str:
        raise NotImplementedError(f"{type(self).__name__} has no model name")

    def get_chat_template(self) -> ChatTemplate:
        return self.chat_template

    def cache_prefix(self, prefix: str) -> None:
        """Prefill ``prefix`` so later requests that start with it reuse its KV cache."""

    def commit_lazy_operations(self, s: StreamExecutor) -> None:
        self.cache_prefix(s.text_)

    def generate(self, s: StreamExecutor, sampling_params: SglSamplingParams) -> tuple[Any, Any]:
        raise NotImplementedError(f"{type(self).__name__} cannot generate")

    def generate_stream(
        self, s: StreamExecutor, sampling_params: SglSamplingParams
    ) -> Iterator[tuple[str, dict]]:
        raise NotImplementedError(f"{type(self).__name__} cannot stream")

    def select(
        self,
        s: StreamExecutor,
        choices: list[str],
        temperature: float,
        choices_method: ChoicesSamplingMethod,
    ) -> ChoicesDecision:
        raise NotImplementedError(f"{type(self).__name__} cannot select")

    def end_program(self, s: StreamExecutor) -> None:
        """Called when a program (or a forked branch) ends."""

    def flush_cache(self) -> bool:
        return False

    def get_server_info(self) -> dict[str, Any] | None:
        return None

    def shutdown(self) -> None:
        """Release what the backend owns."""


def resolve_backend(backend: Any) -> BaseBackend:
    """Accept a backend, an object with an ``endpoint`` backend, or a radixlm ``Engine``."""
    if backend is None:
        raise ValueError(
            "no backend: pass backend=... or call set_default_backend(Engine()) first"
        )
    if isinstance(backend, BaseBackend):
        return backend
    if isinstance(getattr(backend, "endpoint", None), BaseBackend):
        return backend.endpoint
    from radixlm.runtime.engine import Engine

    if isinstance(backend, Engine):
        from radixlm.lang.backend.engine import EngineBackend

        return EngineBackend(backend)
    raise TypeError(f"{type(backend).__name__} is not a backend of the language")
