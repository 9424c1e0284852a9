"""The same programs through a launched server: RuntimeEndpoint (/generate) and OpenAI (/v1)."""

from __future__ import annotations

import base64

import pytest

import radixlm as sgl

SHOTS = (
    "Q: What is the capital of France?\nA: Paris\n\n"
    "Q: What is the capital of Germany?\nA: Berlin\n\n"
    "Q: What is the capital of Italy?\nA: Rome\n\n"
    "Q: What is the capital of Spain?\nA: Madrid\n\n"
)


@sgl.function
def capital_qa(s, country):
    s += SHOTS
    s += "Q: What is the capital of " + country + "?\nA:"
    s += sgl.gen("answer", max_tokens=3, stop="\n")


@sgl.function
def pick_capital(s):
    s += "The capital of France is"
    s += sgl.select("city", choices=[" Paris", " Rome", " a city in Italy"])


def test_endpoint_runs_few_shot_and_batches(endpoint):
    japan = capital_qa.run(country="Japan", temperature=0, backend=endpoint)
    assert japan["answer"].strip() == "Tokyo"
    states = capital_qa.run_batch([{"country": "Japan"}, {"country": "the United Kingdom"}],
                                  temperature=0, backend=endpoint)
    assert [s["answer"].strip() for s in states] == ["Tokyo", "London"]
    assert states[1].get_meta_info("answer")["cached_tokens"] > 50


def test_endpoint_select_scores_match_the_engine_backend(endpoint, smol):
    remote = pick_capital.run(backend=endpoint)
    local = pick_capital.run(backend=smol)
    assert remote["city"] == local["city"] == " Paris"
    assert remote.get_meta_info("city")["normalized_prompt_logprobs"] == pytest.approx(
        local.get_meta_info("city")["normalized_prompt_logprobs"], abs=1e-3
    )


def test_endpoint_streams_and_controls_the_cache(endpoint):
    state = capital_qa.run(country="Japan", temperature=0, stream=True, backend=endpoint)
    chunks = list(state.text_iter("answer"))
    assert "".join(chunks) == state["answer"]
    assert sgl.flush_cache(endpoint) is True
    assert "stats" in sgl.get_server_info(endpoint)


def test_endpoint_reports_a_rejected_request(endpoint):
    @sgl.function
    def bad(s):
        s += "Hi" + sgl.gen("x", temperature=-1.0)

    assert isinstance(bad.run(backend=endpoint).error(), ValueError)


@pytest.fixture(scope="module")
def openai_model(server_url) -> str:
    import openai

    return openai.OpenAI(base_url=server_url + "/v1", api_key="EMPTY").models.list().data[0].id


def test_openai_chat_backend_generates_an_assistant_turn(server_url, openai_model):
    backend = sgl.OpenAI(openai_model, base_url=server_url + "/v1")

    @sgl.function
    def chat(s):
        s += sgl.system("You answer with one word.")
        s += sgl.user("What is the capital of Japan?")
        s += sgl.assistant(sgl.gen("answer", max_tokens=10))

    state = chat.run(temperature=0, backend=backend)
    assert state.error() is None
    assert "Tokyo" in state["answer"]
    assert state.messages()[-1]["role"] == "assistant"


def test_openai_chat_backend_requires_gen_right_after_assistant(server_url, openai_model):
    backend = sgl.OpenAI(openai_model, base_url=server_url + "/v1")

    @sgl.function
    def misplaced(s):
        s += "plain text " + sgl.gen("x", max_tokens=2)

    assert "assistant_begin" in str(misplaced.run(backend=backend).error())


def test_openai_completion_backend_few_shot_and_select(server_url, openai_model, smol):
    backend = sgl.OpenAI(openai_model, is_chat_model=False, base_url=server_url + "/v1")
    assert capital_qa.run(country="Japan", temperature=0, backend=backend)["answer"].strip() \
        == "Tokyo"
    remote = pick_capital.run(backend=backend)
    local = pick_capital.run(backend=smol)
    assert remote["city"] == " Paris"
    assert remote.get_meta_info("city")["normalized_prompt_logprobs"] == pytest.approx(
        local.get_meta_info("city")["normalized_prompt_logprobs"], abs=1e-3
    )


def test_openai_backend_counts_token_usage(server_url, openai_model):
    """SGLang's ``OpenAI.token_usage``: the tokens of every request the backend sent."""
    backend = sgl.OpenAI(openai_model, is_chat_model=False, base_url=server_url + "/v1")
    assert (backend.token_usage.prompt_tokens, backend.token_usage.completion_tokens) == (0, 0)
    capital_qa.run(country="Japan", temperature=0, backend=backend)
    first = backend.token_usage.prompt_tokens
    assert first > 20 and 0 < backend.token_usage.completion_tokens <= 16
    pick_capital.run(backend=backend)  # select: echo requests count too
    assert backend.token_usage.prompt_tokens > first
    backend.token_usage.reset()
    assert backend.token_usage.prompt_tokens == backend.token_usage.completion_tokens == 0


def test_backends_have_sglangs_endpoint(endpoint, smol):
    assert endpoint.endpoint is endpoint and smol.endpoint is smol


PNG = b"\x89PNG\r\n\x1a\n" + bytes(24)  # the signature is what identifies it


@sgl.function
def image_qa(s, picture):
    s += sgl.user(sgl.image(picture) + "What is in this picture?")
    s += sgl.assistant(sgl.gen("answer", max_tokens=8))


def test_openai_backend_sends_images_as_image_url_parts(server_url, openai_model, tmp_path):
    """SGLang's image_qa through the OpenAI backend: the user message carries OpenAI's vision
    parts in the program's order; radixlm's text-only server refuses them by name (a 400)."""
    import openai

    picture = tmp_path / "cat.png"
    picture.write_bytes(PNG)
    backend = sgl.OpenAI(openai_model, base_url=server_url + "/v1")
    state = image_qa.run(picture=str(picture), temperature=0, backend=backend)
    error = state.error()
    assert isinstance(error, openai.BadRequestError)
    refusal = "messages[0].content[0] (image_url) is not supported by this text-only model"
    assert refusal in str(error)
    user = state.messages()[-1]
    assert user["role"] == "user"
    assert user["content"] == [
        {"type": "image_url",
         "image_url": {"url": "data:image/png;base64," + base64.b64encode(PNG).decode()}},
        {"type": "text", "text": "What is in this picture?"},
    ]  # fmt: skip
    assert "<image>What is in this picture?" in state.text()


def test_image_sources_become_urls(tmp_path):
    from radixlm.lang.media import image_url

    assert image_url("https://example.com/cat.png") == "https://example.com/cat.png"
    assert image_url(PNG).startswith("data:image/png;base64,")
    jpeg = tmp_path / "x.jpg"
    jpeg.write_bytes(b"\xff\xd8\xff" + bytes(8))
    assert image_url(jpeg).startswith("data:image/jpeg;base64,")
    with pytest.raises(ValueError, match="no such file"):
        image_url(str(tmp_path / "missing.png"))
    with pytest.raises(ValueError, match="not an image"):
        image_url(b"plain text")


def test_images_need_a_chat_model(server_url, openai_model, tmp_path):
    picture = tmp_path / "cat.png"
    picture.write_bytes(PNG)
    backend = sgl.OpenAI(openai_model, is_chat_model=False, base_url=server_url + "/v1")
    error = image_qa.run(picture=str(picture), backend=backend).error()
    assert isinstance(error, ValueError) and "image input is not supported" in str(error)


PEOPLE = "".join(f"Name: {n}\nAge: {a}\nCity: {c}\n\n" for n, a, c in
                 [("Anna", 31, "Paris"), ("Ben", 42, "Rome"), ("Carl", 25, "Oslo")])  # fmt: skip


def _person(s, second="Age"):
    s += PEOPLE + "Name:" + sgl.gen("name", stop="\n", max_tokens=16)
    s += f"\n{second}:" + sgl.gen("second", stop="\n", max_tokens=8)
    s += "\nCity:" + sgl.gen("city", stop="\n", max_tokens=16) + "\n"


def _usage(backend, program, **kwargs):
    backend.token_usage.reset()
    state = program.run(temperature=0, backend=backend, **kwargs)
    assert state.error() is None
    return backend.token_usage.prompt_tokens, [state[k] for k in ("name", "second", "city")]


@pytest.mark.parametrize("second", ["Age", "Country"])
def test_api_speculation_answers_several_gens_from_one_request(server_url, openai_model, second):
    """SGLang's num_api_spec_tokens on a completion model: one request without stops, split at
    each gen's stop while the program's text matches it (fewer prompt tokens sent); where the
    program writes other text than the model did ("Country" for its "Age"), the next gen asks
    again. The variables are those of the program run without speculation."""
    backend = sgl.OpenAI(openai_model, is_chat_model=False, base_url=server_url + "/v1")
    plain = sgl.function(lambda s: _person(s, second))
    spec = sgl.function(num_api_spec_tokens=48)(lambda s: _person(s, second))
    plain_tokens, plain_values = _usage(backend, plain)
    spec_tokens, spec_values = _usage(backend, spec)
    assert spec_values == plain_values and all(v.strip() for v in plain_values)
    if second == "Age":
        assert spec_tokens * 2 < plain_tokens  # one prompt sent instead of three
    else:
        assert spec_tokens > plain_tokens / 2  # the second gen asked again
