"""SGLang-style frontend programs, written against ``import radixlm as sgl`` only, run on
``sgl.RuntimeEndpoint(url)`` and (those marked ``BOTH_BACKENDS``, plus one cross-check) on an
in-process ``sgl.Engine``, on the embedded SmolLM2-135M-Instruct.

The checks are about structure: variable types, that a select picks one of its choices, that
constrained output matches its constraint, branch counts, message lists, stream chunks that add
up to the final text, finish reasons. Nothing depends on facts the 135M model may not know."""

from __future__ import annotations

import json
import re

import pytest

import radixlm as sgl
from radixlm.lang import CompiledFunction, ProgramState

jsonschema = pytest.importorskip("jsonschema")

# Both backends share the /generate-style client code and differ in transport and in where the
# chat template comes from; the programs that touch those run on both, the rest on the endpoint.
BOTH_BACKENDS = pytest.mark.parametrize("backend", ["endpoint", "engine"], indirect=True)

FEW_SHOT = "Q: What is 2 + 2?\nA: 4\nQ: What is 3 + 5?\nA: 8\n"


@sgl.function
def few_shot_qa(s, question):
    s += FEW_SHOT + "Q: " + question + "\nA:"
    s += sgl.gen("answer", max_tokens=16, stop="\n")


@BOTH_BACKENDS
def test_few_shot_qa_stops_at_the_stop_string(backend):
    state = few_shot_qa.run(question="What is 1 + 1?", temperature=0)
    assert state.error() is None
    answer = state["answer"]
    assert isinstance(answer, str) and answer.strip() and "\n" not in answer
    # the stop string ends the variable and is not written into the program's text
    assert state.text() == FEW_SHOT + "Q: What is 1 + 1?\nA:" + answer
    meta = state.get_meta_info("answer")
    assert meta["finish_reason"] == {"type": "stop", "matched": "\n"}
    assert 1 <= meta["completion_tokens"] <= 16 and meta["prompt_tokens"] > 10


CHOICES = [" yes", " no", " maybe so"]


@sgl.function
def pick(s, question, method=None):
    s += "Question: " + question + "\nAnswer:"
    if method is None:
        s += sgl.select("answer", choices=CHOICES)
    else:
        s += sgl.select("answer", choices=CHOICES, choices_method=method)


@BOTH_BACKENDS
def test_select_returns_one_of_the_choices(backend):
    state = pick.run(question="Is the sky blue?")
    assert state.error() is None and state["answer"] in CHOICES
    assert state.text().endswith("\nAnswer:" + state["answer"])
    scores = state.get_meta_info("answer")["normalized_prompt_logprobs"]
    assert len(scores) == len(CHOICES) and all(isinstance(x, float) for x in scores)
    assert CHOICES[scores.index(max(scores))] == state["answer"]  # the best-scored choice
    for method in (sgl.greedy_token_selection, sgl.unconditional_likelihood_normalized):
        assert pick.run(question="Is fire cold?", method=method)["answer"] in CHOICES
    # a batch of selects (HellaSwag-style), each answer one of the choices, in order
    questions = ["Is ice cold?", "Is the sun dark?", "Can fish swim?"]
    states = pick.run_batch([{"question": q} for q in questions])
    assert [q in st.text() for q, st in zip(questions, states, strict=True)] == [True] * 3
    assert all(st["answer"] in CHOICES for st in states)


YEAR = r"(19|20)[0-9][0-9]"


@sgl.function
def typed_values(s):
    s += "Q: How many legs does a dog have?\nA: " + sgl.gen_int("legs", max_tokens=4) + "\n"
    s += "Q: A year in the last century?\nA: " + sgl.gen("year", regex=YEAR, max_tokens=6) + "\n"
    s += "Q: The value of pi?\nA: " + sgl.gen("pi", dtype=float, max_tokens=8) + "\n"
    s += "Q: Is the sky blue?\nA: " + sgl.gen("blue", dtype=bool, max_tokens=4) + "\n"
    s += "Q: Name a colour in quotes.\nA: " + sgl.gen("colour", regex=sgl.REGEX_STR, max_tokens=8)


def test_gen_int_dtype_and_regex_values(backend):
    state = typed_values.run(temperature=0)
    assert state.error() is None
    legs = state["legs"]
    assert type(legs) is int and int(legs) == legs  # SGLang programs call int(...) on it
    assert re.search(r"How many legs does a dog have\?\nA: [-+]?" + str(abs(legs)), state.text())
    assert re.fullmatch(YEAR, state["year"]) and isinstance(state["year"], str)
    assert type(state["pi"]) is float
    assert type(state["blue"]) is bool
    assert re.fullmatch(sgl.REGEX_STR, state["colour"])


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer"},
        "student": {"type": "boolean"},
    },
    "required": ["name", "age", "student"],
    "additionalProperties": False,
}


@sgl.function
def person_json(s):
    s += sgl.user("Describe a person as JSON with a name, an age and whether they study.")
    s += sgl.assistant(sgl.gen("person", max_tokens=48, json_schema=json.dumps(PERSON)))


@BOTH_BACKENDS
def test_json_schema_gen_parses_and_matches_the_schema(backend):
    state = person_json.run(temperature=0)
    assert state.error() is None
    person = json.loads(state["person"])
    jsonschema.validate(person, PERSON)
    assert set(person) == {"name", "age", "student"}
    assert state.get_meta_info("person")["finish_reason"]["type"] == "stop"  # not cut off


@sgl.function
def two_turns(s, question):
    s += sgl.system("You are a terse assistant.")
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("first", max_tokens=8))
    with s.user():
        s += "Say it again, shorter."
    s += sgl.assistant_begin() + sgl.gen("second", max_tokens=8) + sgl.assistant_end()


@BOTH_BACKENDS
def test_roles_give_the_message_list(backend):
    state = two_turns.run(question="Greet me.", temperature=0)
    assert state.error() is None
    assert isinstance(state["first"], str) and isinstance(state["second"], str)
    assert state.messages() == [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Greet me."},
        {"role": "assistant", "content": state["first"]},
        {"role": "user", "content": "Say it again, shorter."},
        {"role": "assistant", "content": state["second"]},
    ]
    # the text is rendered with the model's own template (ChatML for SmolLM2)
    assert state.text().count("<|im_start|>") == 5
    assert "<|im_start|>assistant\n" + state["first"] + "<|im_end|>" in state.text()


@sgl.function
def three_fruits(s):
    s += "Three fruits, one per line:\n"
    forks = s.fork(3)
    forks += lambda i: f"{i + 1}."
    forks += sgl.gen("fruit", max_tokens=6, stop="\n")
    branch_texts = [f.text() for f in forks]
    forks.join()
    return branch_texts


@sgl.function
def appended_branches(s):
    s += "Colours:"
    forks = s.fork(2)
    forks += [" red and", " blue and"]
    forks += sgl.gen("more", max_tokens=3, ignore_eos=True)
    branch_texts = [f.text() for f in forks]
    forks.join("concate_and_append")
    return branch_texts


def test_fork_join_gives_one_value_per_branch(backend):
    state = three_fruits.run(temperature=0)
    assert state.error() is None
    fruits = state["fruit"]
    assert isinstance(fruits, list) and len(fruits) == 3
    assert all(isinstance(f, str) and "\n" not in f for f in fruits)
    prefix = "Three fruits, one per line:\n"
    assert state.ret_value == [f"{prefix}{i + 1}.{fruit}" for i, fruit in enumerate(fruits)]
    assert state.text() == prefix  # gather_variable leaves the parent's text as it was

    state = appended_branches.run(temperature=0)
    assert state.error() is None
    texts = state.ret_value
    assert len(texts) == 2 and texts[0].startswith("Colours: red and")
    assert texts[1].startswith("Colours: blue and")
    # concate_and_append: each branch's new text goes after the parent's, in branch order
    assert state.text() == "Colours:" + texts[0][len("Colours:") :] + texts[1][len("Colours:") :]


def test_run_batch_returns_the_states_in_order_with_a_progress_bar(backend, capsys):
    questions = [f"What is {i} + {i}?" for i in range(1, 5)]
    states = few_shot_qa.run_batch([{"question": q} for q in questions], temperature=0,
                                   num_threads=2, progress_bar=True)  # fmt: skip
    assert len(states) == len(questions)
    for question, state in zip(questions, states, strict=True):
        assert isinstance(state, ProgramState) and state.error() is None
        assert state.text() == FEW_SHOT + "Q: " + question + "\nA:" + state["answer"]
    assert "4/4" in capsys.readouterr().err  # tqdm's bar reached the end
    assert few_shot_qa.run_batch([]) == []


@sgl.function
def story(s):
    s += "Once upon a time"
    s += sgl.gen("story", max_tokens=10, ignore_eos=True)


@BOTH_BACKENDS
def test_streaming_chunks_add_up_to_the_final_text(backend):
    whole = story.run(temperature=0)
    state = story.run(temperature=0, stream=True)
    chunks = list(state.text_iter())
    assert all(isinstance(c, str) and c for c in chunks) and len(chunks) >= 2
    assert "".join(chunks) == state.text() == whole.text()

    state = story.run(temperature=0, stream=True)
    pieces = list(state.text_iter("story"))
    assert len(pieces) >= 2  # incremental: 10 tokens do not arrive as one piece
    assert "".join(pieces) == state["story"] == whole["story"]
    assert state.get_meta_info("story")["completion_tokens"] == 10


THINK = r"<think>\n[a-z ]{1,24}\n</think>\n\n[A-Za-z0-9 ]{1,16}\."


@sgl.function
def reasoned(s):
    s += sgl.user("What is 2 + 2? Think first.")
    s += sgl.assistant(sgl.separate_reasoning(sgl.gen("answer", max_tokens=48, regex=THINK),
                                              model_type="deepseek-r1"))  # fmt: skip


def test_separate_reasoning_splits_the_think_block(backend):
    state = reasoned.run(temperature=0)
    assert state.error() is None
    reasoning, answer = state["answer_reasoning_content"], state["answer"]
    assert re.fullmatch(r"[a-z ]{1,24}", reasoning.strip()) and reasoning.strip()
    assert re.fullmatch(r"[A-Za-z0-9 ]{1,16}\.", answer)
    assert "<think>" not in answer and "</think>" not in answer
    raw = f"<think>\n{reasoning.strip()}\n</think>\n\n{answer}"
    assert state.messages()[-1] == {"role": "assistant", "content": raw}  # the text keeps it


@sgl.function
def continue_story(s, stop_regex=None):
    s += "Once upon a time"
    s += sgl.gen("rest", max_tokens=12, ignore_eos=True, stop_regex=stop_regex)


def test_stop_regex_ends_the_variable_before_the_match(backend):
    full = continue_story.run(temperature=0)["rest"]
    middle = full[len(full) // 2 : len(full) // 2 + 3]
    pattern = re.escape(middle[0]) + "." + re.escape(middle[2])  # fixed width: no ambiguity
    match = re.search(pattern, full)
    state = continue_story.run(stop_regex=pattern, temperature=0)
    assert state.error() is None
    assert state["rest"] == full[: match.start()]
    finish = state.get_meta_info("rest")["finish_reason"]
    assert finish["type"] == "stop"
    # radixlm reports the matched text; SGLang reports the pattern: either names this match
    assert finish["matched"] in (match.group(0), pattern)


@sgl.function
def planner(s, topic):
    s += sgl.system("You plan things.")
    s += sgl.user("Plan " + topic + ".")
    s += sgl.assistant(sgl.gen("plan", max_tokens=4))
    s += "Mood:" + sgl.select("mood", choices=[" calm", " busy"])
    forks = s.fork(2)
    forks += lambda i: f" Step {i + 1}:"
    forks += sgl.gen("step", max_tokens=3)
    forks.join()
    s += " Done."


def test_compiled_program_runs_like_the_direct_one(backend):
    compiled = planner.compile()
    assert isinstance(compiled, CompiledFunction)
    state = compiled.run(topic="a picnic", temperature=0)
    direct = planner.run(topic="a picnic", temperature=0)
    assert state.error() is None and direct.error() is None
    assert state.text() == direct.text() and state.messages() == direct.messages()
    assert state["plan"] == direct["plan"] and state["mood"] in (" calm", " busy")
    assert isinstance(state["step"], list) and len(state["step"]) == 2
    assert state["step"] == direct["step"]


@sgl.function
def look_at(s, media):
    s += sgl.user(media + "What is this?")
    s += sgl.assistant(sgl.gen("answer", max_tokens=4))


@pytest.mark.parametrize("media, kind", [(sgl.image("cat.png"), "image"),
                                         (sgl.video("cat.mp4"), "video")])  # fmt: skip
def test_media_input_fails_clearly_on_a_text_only_model(backend, media, kind):
    state = look_at.run(media=media)
    error = state.error()
    assert isinstance(error, ValueError)
    assert f"{kind} input is not supported" in str(error)
    with pytest.raises(sgl.ProgramError, match="answer"):
        state["answer"]  # noqa: B018  (reading a variable of the failed program)


@sgl.function
def exact_length(s):
    s += "Count:"
    s += sgl.gen("count", min_tokens=6, max_tokens=6)


def test_temperature_zero_is_deterministic_and_reuses_the_cache(backend):
    first = few_shot_qa.run(question="What is 6 + 1?", temperature=0)
    second = few_shot_qa.run(question="What is 6 + 1?", temperature=0)
    assert first.text() == second.text() and first["answer"] == second["answer"]
    # the second run's prompt was cached by the first (SGLang's meta_info cached_tokens)
    meta = second.get_meta_info("answer")
    assert meta["cached_tokens"] > 0 and meta["cached_tokens"] <= meta["prompt_tokens"]
    batch = few_shot_qa.run_batch([{"question": "What is 6 + 1?"}] * 2, temperature=0)
    assert [b["answer"] for b in batch] == [first["answer"]] * 2
    # min_tokens: the gen runs to exactly max_tokens
    meta = exact_length.run(temperature=0).get_meta_info("count")
    assert meta["completion_tokens"] == 6 and meta["finish_reason"]["type"] == "length"


def test_both_backends_give_the_same_greedy_program(endpoint, smol_engine):
    """RuntimeEndpoint over HTTP and the in-process Engine run the same float32 model."""
    over_http = two_turns.run(question="Name a colour.", temperature=0, backend=endpoint)
    in_process = two_turns.run(question="Name a colour.", temperature=0, backend=smol_engine)
    assert over_http.messages() == in_process.messages()
    assert over_http.text() == in_process.text()
