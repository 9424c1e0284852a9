"""Property-based requests from the server's own OpenAPI schema never get a 5xx."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, settings

from radixlm.runtime.config import ServerArgs
from radixlm.server.app import create_app

schemathesis = pytest.importorskip("schemathesis")

# NOTE: /cache/tree/stream never ends by design (the web page follows it); the tree route it
# repeats is fuzzed as /cache/tree
schema = schemathesis.openapi.from_dict(create_app(ServerArgs()).openapi()).exclude(
    path="/cache/tree/stream"
)
LIMITS = {
    "max_tokens": 8, "max_completion_tokens": 8, "max_new_tokens": 8, "max_output_tokens": 8,
    "n": 3,
}
# NOTE: grammar tests live elsewhere (tool_choice and strict tools compile call grammars)
CONSTRAINTS = ("regex", "json_schema", "response_format", "tool_choice", "strict")


# NOTE: every other check runs (status codes, content types and headers documented, responses
# matching their schemas, schema-violating requests refused). Left out: response time (the
# benchmarks' concern), and "every schema-valid request is accepted": the schema cannot say
# what only the loaded model knows (token ids below its vocabulary size, a prompt plus
# max_tokens within its context) nor that a prompt must not be empty; those get a 400 that
# names the field, which the other tests check.
SLOW_CHECKS = [schemathesis.checks.max_response_time, schemathesis.checks.positive_data_acceptance]


def bounded(body):
    """Cap generation lengths and sample counts, and drop grammar constraints (their compile
    time is the constrained-decoding tests' concern), so that each example stays cheap."""
    if isinstance(body, list):
        return [bounded(item) for item in body]
    if not isinstance(body, dict):
        return body
    out = {k: bounded(v) for k, v in body.items() if k not in CONSTRAINTS}
    for key, cap in LIMITS.items():
        if isinstance(out.get(key), int) and not isinstance(out[key], bool) and out[key] > cap:
            out[key] = cap
    if "messages" in out or "prompt" in out:
        out.setdefault("max_tokens", 8)
    if "input" in out:
        out.setdefault("max_output_tokens", 8)
    if isinstance(out.get("sampling_params"), dict):
        out["sampling_params"].setdefault("max_new_tokens", 8)
    return out


@schema.parametrize()
@settings(
    max_examples=8, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
def test_no_server_errors(case, tiny_server):
    case.body = bounded(case.body)
    response = case.call(base_url=tiny_server.url, timeout=60)
    assert response.status_code < 500, (case.method, case.path, case.body, response.text)
    excluded = list(SLOW_CHECKS)
    if case.path == "/flush_cache" and not isinstance(case.body, (dict, list, str, int, float)):
        # NOTE: its body is optional (a bare POST flushes memory, as SGLang's clients send it);
        # schemathesis' negative phase still counts an omitted optional body as invalid
        excluded.append(schemathesis.checks.negative_data_rejection)
    case.validate_response(response, excluded_checks=excluded)
