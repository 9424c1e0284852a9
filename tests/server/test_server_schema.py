"""Property-based requests from the server's own OpenAPI schema never get a 5xx."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, settings

schemathesis = pytest.importorskip("schemathesis")

schema = schemathesis.pytest.from_fixture("tiny_schema")


@pytest.fixture()
def tiny_schema(tiny_server):
    return schemathesis.openapi.from_url(f"{tiny_server.url}/openapi.json")


@schema.parametrize()
@settings(
    max_examples=8, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
def test_no_server_errors(case):
    response = case.call(timeout=60)
    assert response.status_code < 500, (case.method, case.path, case.body, response.text)
