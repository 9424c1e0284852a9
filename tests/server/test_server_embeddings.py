"""/v1/embeddings through the official openai client, and SGLang's /encode, on the tiny Llama
(its vectors are checked against transformers in tests/runtime/embeddings)."""

from __future__ import annotations

import base64
import struct

import openai
import pytest

TEXTS = ["The capital of France is Paris.", "hello", "def f(x):\n    return x * 2"]


@pytest.fixture(scope="module")
def client(tiny_server):
    return openai.OpenAI(base_url=f"{tiny_server.url}/v1", api_key="unused", max_retries=0)


def _close(a: list[float], b: list[float], tol: float = 1e-5) -> bool:
    return len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b)) < tol


def test_embeddings_of_a_batch_are_in_order_and_equal_one_at_a_time(client):
    batch = client.embeddings.create(model="tiny", input=TEXTS)
    assert batch.object == "list" and batch.model == "tiny"
    assert [d.index for d in batch.data] == [0, 1, 2]
    for text, item in zip(TEXTS, batch.data):
        one = client.embeddings.create(model="tiny", input=text).data[0].embedding
        assert len(item.embedding) == 64 and _close(item.embedding, one)
        assert abs(sum(x * x for x in one) - 1.0) < 1e-4  # NOTE: normalised
    assert not _close(batch.data[0].embedding, batch.data[1].embedding, 1e-2)
    assert batch.usage.prompt_tokens == batch.usage.total_tokens > len(TEXTS)


def test_token_ids_base64_and_the_extra_fields(client, tiny_server):
    # NOTE: without encoding_format the SDK asks for base64 and decodes it with numpy
    decoded_by_sdk = client.embeddings.create(model="tiny", input=[[5, 6, 7, 8], [9, 10]])
    with tiny_server.client() as http:
        body = {"input": [[5, 6, 7, 8]], "encoding_format": "float"}
        floats = http.post("/v1/embeddings", json=body).json()["data"][0]["embedding"]
    assert _close(decoded_by_sdk.data[0].embedding, floats)
    raw = client.embeddings.create(model="tiny", input=[5, 6, 7, 8], encoding_format="base64")
    data = base64.b64decode(raw.data[0].embedding)
    assert _close(list(struct.unpack(f"<{len(data) // 4}f", data)), floats)
    floats = decoded_by_sdk
    assert floats.usage.prompt_tokens == 6
    mean = client.embeddings.create(model="tiny", input=[5, 6, 7, 8],
                                    extra_body={"pooling": "mean", "normalize": False})
    assert not _close(mean.data[0].embedding, floats.data[0].embedding, 1e-2)
    same = client.embeddings.create(model="tiny", input=[5, 6, 7, 8], dimensions=64)
    assert _close(same.data[0].embedding, floats.data[0].embedding)


def test_encode_route_answers_as_sglang(tiny_client, client):
    one = tiny_client.post("/encode", json={"text": TEXTS[0]}).json()
    assert set(one) >= {"embedding", "meta_info"} and one["meta_info"]["completion_tokens"] == 0
    openai_one = client.embeddings.create(model="tiny", input=TEXTS[0]).data[0].embedding
    assert _close(one["embedding"], openai_one)
    many = tiny_client.post("/encode", json={"input_ids": [[5, 6], [7]], "pooling": "mean"})
    assert many.status_code == 200 and len(many.json()) == 2


BAD = [
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": ["a", ""]}, "input[1]"),
    ({"input": [[5], []]}, "input[1]"),
    ({"input": "hi", "dimensions": 8}, "dimensions"),
    ({"input": "hi", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "hi", "pooling": "cls"}, "pooling"),
    ({"input": [10**9]}, "input_ids"),
    ({"input": 5}, "input"),
]


@pytest.mark.parametrize(("body", "needle"), BAD)
def test_bad_embedding_requests_are_400_naming_the_field(tiny_client, body, needle):
    r = tiny_client.post("/v1/embeddings", json=body)
    assert r.status_code == 400, r.text
    assert needle in r.text


def test_too_long_and_unknown_model(client, tiny_client):
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="tiny", input=[5] * 1024)
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="other", input="hi")
    r = tiny_client.post("/encode", json={"text": "hi", "pooling": "cls"})
    assert r.status_code == 400
