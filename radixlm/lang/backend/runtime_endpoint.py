"""A running radixlm (or SGLang-compatible) server, over its native ``/generate`` route."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx

from radixlm.lang.backend.generate_api import GenerateApiBackend
from radixlm.lang.chat_template import (
    ChatTemplate,
    derive_chat_template,
    get_chat_template,
    get_chat_template_by_model_path,
    jinja_renderer,
)


class RuntimeEndpoint(GenerateApiBackend):
    """Run programs on the server at ``base_url``; ``api_key`` is sent as a bearer token.

    Roles use the model's chat template when ``/get_model_info`` returns it (``chat_template``),
    else a registered one guessed from the model path, unless ``chat_template_name`` is given.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        chat_template_name: str | None = None,
        timeout: float | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(
            base_url=self.base_url, headers=headers,
            timeout=httpx.Timeout(timeout, connect=30.0),
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
        )
        self.model_info = self._request("GET", "/get_model_info")
        self._can_tokenize: bool | None = None
        super().__init__(self._template(chat_template_name))

    def _template(self, name: str | None) -> ChatTemplate:
        if name is not None:
            return get_chat_template(name)
        info = self.model_info
        if info.get("chat_template"):
            render = jinja_renderer(info["chat_template"], info.get("bos_token") or "",
                                    info.get("eos_token") or "")
            derived = derive_chat_template(render, "model")
            if derived is not None:
                return derived
        return get_chat_template_by_model_path(str(info.get("model_path", "")))

    def get_model_name(self) -> str:
        return str(self.model_info.get("model_path", ""))

    # -- HTTP ----------------------------------------------------------------------------------

    def _request(self, method: str, path: str, body: dict | None = None) -> Any:
        response = self.client.request(method, path, json=body)
        _check(response)
        return response.json() if response.content else None

    def _generate(self, body: dict[str, Any]) -> dict | list[dict]:
        return self._request("POST", "/generate", body)

    def _generate_stream(self, body: dict[str, Any]) -> Iterator[dict]:
        sent = 0
        with self.client.stream("POST", "/generate", json={**body, "stream": True}) as response:
            if response.status_code != 200:
                response.read()
                _check(response)
            for line in response.iter_lines():
                chunk = _sse_data(line)
                if chunk is None:
                    continue
                if chunk == "[DONE]":
                    break
                data = json.loads(chunk)
                if "error" in data:
                    raise RuntimeError(f"the server failed while streaming: {data['error']}")
                text = data["text"]
                yield {**data, "text": text[sent:]}
                sent = len(text)

    def _encode(self, text: str) -> list[int] | None:
        """Through the server's ``/tokenize`` when it has one."""
        if self._can_tokenize is False:
            return None
        response = self.client.post("/tokenize", json={"text": text})
        self._can_tokenize = response.status_code == 200
        return response.json()["tokens"] if self._can_tokenize else None

    def flush_cache(self) -> bool:
        response = self.client.post("/flush_cache")
        if response.status_code == 405:
            response = self.client.get("/flush_cache")
        return response.status_code == 200

    @property
    def endpoint(self) -> RuntimeEndpoint:
        """As SGLang's ``Runtime.endpoint``, so code written for either reads the same."""
        return self

    def get_server_info(self) -> dict[str, Any]:
        return self._request("GET", "/get_server_info")

    def shutdown(self) -> None:
        self.client.close()


def _sse_data(line: str) -> str | None:
    if not line.startswith("data:"):
        return None
    return line[5:].strip()


def _check(response: httpx.Response) -> None:
    """Raise for an error status: ``ValueError`` for a rejected request (4xx, as the Engine
    raises), ``RuntimeError`` otherwise."""
    if response.status_code == 200:
        return
    try:
        detail = response.json()
    except ValueError:
        detail = response.text
    if isinstance(detail, dict):
        detail = detail.get("error", detail.get("detail", detail))
        if isinstance(detail, dict):
            detail = detail.get("message", detail)
    message = f"{response.request.method} {response.request.url.path}: " \
              f"{response.status_code} {detail}"
    if 400 <= response.status_code < 500 and response.status_code not in (401, 403, 404):
        raise ValueError(message)
    raise RuntimeError(message)
