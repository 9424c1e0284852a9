"""Backends of the language: the in-process Engine, a radixlm server, OpenAI-compatible APIs."""

from __future__ import annotations

from radixlm.lang.backend.base import BaseBackend, resolve_backend
from radixlm.lang.backend.engine import EngineBackend, Runtime
from radixlm.lang.backend.generate_api import GenerateApiBackend
from radixlm.lang.backend.openai import OpenAI
from radixlm.lang.backend.runtime_endpoint import RuntimeEndpoint

__all__ = [
    "BaseBackend", "EngineBackend", "GenerateApiBackend", "OpenAI", "Runtime", "RuntimeEndpoint",
    "resolve_backend",
]
