"""Fixtures of the compatibility suite: the session's server on the embedded SmolLM2-135M-Instruct
(``smol_server``), the frontend backends that reach it, and an official ``openai`` client.

The in-process backend is the session's ``smol_engine`` (tests/conftest.py): float32 like the
server, so greedy programs give the same text on both."""

from __future__ import annotations

import pytest

import radixlm as sgl


@pytest.fixture(scope="session")
def server_url(smol_server) -> str:
    """The session's server on the embedded model (tests/conftest.py)."""
    return smol_server.url


@pytest.fixture(scope="session")
def endpoint(server_url):
    backend = sgl.RuntimeEndpoint(server_url)
    yield backend
    backend.shutdown()


@pytest.fixture()
def backend(request):
    """The default backend of a program run: ``sgl.RuntimeEndpoint(url)``, or, for a test
    parametrized with ``indirect=True`` over ``"endpoint"`` / ``"engine"``, an in-process
    ``sgl.Engine`` too (``sgl.set_default_backend(...)``, as SGLang's README sets it). The
    programs take the default backend, as SGLang programs do."""
    name = getattr(request, "param", "endpoint")
    chosen = request.getfixturevalue("endpoint" if name == "endpoint" else "smol_engine")
    sgl.set_default_backend(chosen)
    yield chosen
    sgl.set_default_backend(None)


@pytest.fixture(scope="module")
def client(server_url):
    openai = pytest.importorskip("openai")
    with openai.OpenAI(base_url=f"{server_url}/v1", api_key="unused",
                       max_retries=0, timeout=120.0) as c:  # fmt: skip
        yield c


@pytest.fixture(scope="module")
def model(client) -> str:
    return client.models.list().data[0].id
