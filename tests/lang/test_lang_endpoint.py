"""The same programs through a launched server: RuntimeEndpoint (/generate) and OpenAI (/v1)."""

from __future__ import annotations

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
