"""The in-process backend: a radixlm ``Engine``, no HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from radixlm.lang.backend.generate_api import GenerateApiBackend
from radixlm.lang.chat_template import (
    ChatTemplate,
    derive_chat_template,
    get_chat_template,
    tokenizer_renderer,
)


class EngineBackend(GenerateApiBackend):
    """Run programs on ``engine``. Roles use the model's own chat template unless
    ``chat_template`` (a registered name or a ChatTemplate) is given."""

    def __init__(
        self,
        engine: Any,
        chat_template: str | ChatTemplate | None = None,
        owns_engine: bool = False,
    ) -> None:
        self.engine = engine
        self.owns_engine = owns_engine
        super().__init__(self._template(chat_template))

    def _template(self, chat_template: str | ChatTemplate | None) -> ChatTemplate:
        if isinstance(chat_template, ChatTemplate):
            return chat_template
        if chat_template is not None:
            return get_chat_template(chat_template)
        render = tokenizer_renderer(self.engine.tokenizer)
        derived = derive_chat_template(render, "model") if render else None
        return derived or get_chat_template("default")

    def _generate(self, body: dict[str, Any]) -> dict | list[dict]:
        body = dict(body)
        return self.engine.generate(body.pop("text", None), **body)

    def _generate_stream(self, body: dict[str, Any]) -> Iterator[dict]:
        body = dict(body)
        return self.engine.generate(body.pop("text", None), stream=True, **body)

    def _encode(self, text: str) -> list[int]:
        return self.engine.tokenizer.encode(text)

    @property
    def endpoint(self) -> EngineBackend:
        """SGLang's ``Runtime.endpoint`` (the backend a program runs on): this backend."""
        return self

    def get_model_name(self) -> str:
        return str(self.engine.info["model_path"])

    def flush_cache(self) -> bool:
        return self.engine.flush_cache()

    def get_server_info(self) -> dict[str, Any]:
        return self.engine.get_server_info()

    def shutdown(self) -> None:
        if self.owns_engine:
            self.engine.shutdown()


def Runtime(model_path: str | None = None, **kwargs: Any) -> EngineBackend:
    """Start an in-process Engine (``Engine(model_path, **kwargs)``) and return it as a backend;
    ``shutdown()`` stops it. Mirrors ``sglang.Runtime``."""
    from radixlm.runtime.engine import Engine

    return EngineBackend(Engine(model_path, **kwargs), owns_engine=True)
