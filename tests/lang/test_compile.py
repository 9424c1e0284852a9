"""SglFunction.compile(): a traced program run as a graph gives what running its code gives.

On the tiny model, greedy: the compiled run's text, messages, variables and return value are
compared with the direct run's."""

from __future__ import annotations

import pytest

import radixlm as sgl
from radixlm.lang.compiler import CompiledFunction, CompileError

SHARED = "A shared introduction that every branch starts with. " * 2


@sgl.function
def planner(s, topic, n=3):
    s += sgl.system("You plan things.")
    s += sgl.user("Plan " + topic + ".")
    with s.assistant():
        s += sgl.gen("plan", max_tokens=n, ignore_eos=True)
    s += SHARED + "Mood:" + sgl.select("mood", choices=[" calm", " busy", " odd"])
    forks = s.fork(2)
    forks += lambda i: f" Step {i}:"
    forks += sgl.gen("step", max_tokens=3, ignore_eos=True)  # one expression, both branches
    forks[1] += " then" + sgl.gen("more", max_tokens=2, ignore_eos=True)
    first = forks[0]["step"]
    forks.join()
    s += " First:" + first
    pair = s.fork(2)
    pair += [" A" + sgl.gen("a", max_tokens=2, ignore_eos=True), " B"]
    pair.join("concate_and_append")
    with s.var_scope("tail"):
        s += " Tail " + topic + sgl.gen("t", max_tokens=2, ignore_eos=True)
    s += " Again:" + s["step"][1] + sgl.gen("plan", max_tokens=2, ignore_eos=True)
    s += " Plan was:" + s["plan"]
    return {"first": first, "topic": topic, "steps": s["step"]}


def _same_state(compiled, direct) -> None:
    assert compiled.error() is None and direct.error() is None
    assert compiled.text() == direct.text()
    assert compiled.messages() == direct.messages()
    assert compiled.stream_executor.variables == direct.stream_executor.variables
    assert compiled.ret_value == direct.ret_value


def test_compiled_run_equals_the_direct_run(tiny):
    compiled = planner.compile()  # no backend: roles render with the running backend's template
    assert isinstance(compiled, CompiledFunction)
    for kwargs in ({"topic": "a picnic"}, {"topic": "a trip", "n": 6}):
        state = compiled.run(**kwargs, temperature=0, backend=tiny)
        _same_state(state, planner.run(**kwargs, temperature=0, backend=tiny))
    assert len(state["plan"]) > 0 and state.messages()[0] == {
        "role": "system", "content": "You plan things."}
    assert state["mood"] in (" calm", " busy", " odd")
    assert len(state["step"]) == 2 and state["more"] == [state["more"][0]]
    assert state.ret_value["topic"] == "a trip" and state.ret_value["steps"] == state["step"]


def test_gen_parameters_and_defaults_from_arguments(tiny):
    compiled = planner.bind(topic="chess").compile()
    short = compiled.run(n=1, temperature=0, backend=tiny)
    long = compiled.run(n=8, temperature=0, backend=tiny)
    assert short.messages()[2]["content"] != long.messages()[2]["content"]
    _same_state(long, planner.run(topic="chess", n=8, temperature=0, backend=tiny))


@sgl.function
def expand(s, tip):
    s += "Expand the tip:" + tip + "\n"
    s += sgl.gen("detailed_tip", max_tokens=4, ignore_eos=True, temperature=0)


@sgl.function
def tip_suggestion(s, topic):
    s += "Here are 2 tips for " + topic + ".\n"
    s += "1." + sgl.gen("tip_1", max_tokens=3, ignore_eos=True) + "\n"
    s += "2." + sgl.gen("tip_2", max_tokens=3, ignore_eos=True) + "\n"
    branch1 = expand(tip=s["tip_1"])
    branch2 = expand(tip=s["tip_2"])
    s += "Tip 1:" + branch1["detailed_tip"] + "\n"
    s += "Tip 2:" + branch2["detailed_tip"] + "\n"
    s += "In summary" + sgl.gen("summary", max_tokens=3, ignore_eos=True)


def test_programs_called_from_the_code_become_streams(tiny, capsys):
    compiled = tip_suggestion.compile()
    graph = compiled.print_graph()
    assert capsys.readouterr().out == graph
    assert {line.split(":")[0] for line in graph.splitlines()} == {
        "stream  0", "stream  1", "stream  2"}
    position = {id(node): i for i, node in enumerate(compiled.nodes)}
    for i, node in enumerate(compiled.nodes):  # an execution order: dependencies first
        for dep in [node.prev_node, *node.source_nodes]:
            assert dep is None or position[id(dep)] < i

    sgl.set_default_backend(tiny)  # a direct run runs the called programs on the default one
    try:
        direct = tip_suggestion.run(topic="sleep", temperature=0)
        state = compiled.run(topic="sleep", temperature=0)
    finally:
        sgl.set_default_backend(None)
    assert state.text() == direct.text() and state.error() is None
    assert state.text().count("Tip ") == 2 and "Expand the tip" not in state.text()


def test_run_batch_returns_the_states_in_order(tiny):
    topics = ["rain", "snow", "wind", "fog"]
    compiled = tip_suggestion.compile(backend=tiny)  # runs fall back to the compile backend
    sgl.set_default_backend(tiny)
    try:
        direct = [tip_suggestion.run(topic=t, temperature=0).text() for t in topics]
    finally:
        sgl.set_default_backend(None)
    states = compiled.run_batch([{"topic": t} for t in topics], temperature=0, num_threads=3)
    assert [s.text() for s in states] == direct
    assert len(set(direct)) == len(topics)
    gen = compiled.run_batch([("snow",), {"topic": "rain"}], temperature=0,
                             generator_style=True)
    assert [s.text() for s in gen] == [direct[1], direct[0]]
    assert compiled.run_batch([]) == []


@sgl.function
def branches_on_an_argument(s, question):
    if question == "hi":
        s += "Hello"


@sgl.function
def branches_on_generated_text(s):
    s += sgl.gen("answer", max_tokens=2)
    if s["answer"]:
        s += "More"


@sgl.function
def formats_an_argument(s, question):
    s += f"Q: {question}"


@sgl.function
def loops_over_an_argument(s, questions):
    for q in questions:
        s += q


@sgl.function
def reads_a_string_method(s):
    s += sgl.gen("answer", max_tokens=2)
    s += s["answer"].strip()


@sgl.function
def reads_the_text(s):
    s += "Hi"
    s += s.text()


@sgl.function
def appends_to_a_joined_branch(s):
    forks = s.fork(2)
    forks.join()
    forks[0] += "late"


@pytest.mark.parametrize("program", [
    branches_on_an_argument, branches_on_generated_text, formats_an_argument,
    loops_over_an_argument, reads_a_string_method, reads_the_text, appends_to_a_joined_branch,
])
def test_code_that_inspects_values_cannot_be_compiled(program):
    with pytest.raises(CompileError, match=f"cannot compile {program.__name__}"):
        program.compile()
    assert issubclass(CompileError, TypeError)  # what SGLang raises for a traced argument


def test_wrong_arguments_are_type_errors(tiny):
    compiled = planner.compile()
    with pytest.raises(TypeError, match="missing required argument 'topic'"):
        compiled.run(backend=tiny)
    with pytest.raises(TypeError, match="unexpected"):
        compiled.run(topic="x", colour="red", backend=tiny)
    with pytest.raises(TypeError, match="must be a str"):
        compiled.run(topic=3, backend=tiny)
    states = compiled.run_batch([{"topic": 3}, {"topic": "x"}], temperature=0, backend=tiny)
    assert isinstance(states[0].error(), TypeError) and states[1].error() is None


def test_a_failing_stream_fails_its_readers_without_hanging(tiny):
    @sgl.function
    def reads_a_failed_branch(s):
        s += "Root."
        forks = s.fork(2)
        forks[0] += sgl.gen("bad", max_tokens=2, temperature=-1.0)
        forks[1] += sgl.gen("good", max_tokens=2, ignore_eos=True)
        s += forks[0]["bad"] + forks[1]["good"]
        s += sgl.gen("after", max_tokens=2)

    state = reads_a_failed_branch.compile().run(backend=tiny)
    assert isinstance(state.error(), sgl.ProgramError)
    assert "temperature" in str(state.error())
    with pytest.raises(sgl.ProgramError):
        state["after"]
    assert state.text() == "Root."
