"""Tracing: the expression graph, bound arguments, and the constant prefix run_batch caches."""

from __future__ import annotations

import radixlm as sgl
from radixlm.lang.backend.base import BaseBackend
from radixlm.lang.chat_template import get_chat_template
from radixlm.lang.tracer import extract_prefix_by_tracing


@sgl.function
def few_shot(s, question):
    s += "Shots shots shots.\n"
    s += "Q: " + question + "\nA:"
    s += sgl.gen("answer", max_tokens=8)
    s += sgl.select("grade", choices=["good", "bad"])


def test_trace_prints_the_graph_with_placeholders(capsys):
    tracer = few_shot.trace()
    graph = tracer.print_graph()
    assert capsys.readouterr().out == graph
    for piece in ("Constant('Shots shots shots.\\n')", "Argument(name='question')",
                  "Gen('answer')", "Select('grade'"):
        assert piece in graph
    assert set(tracer.variables) == {"answer", "grade"}


def test_bound_arguments_appear_as_constants():
    graph = few_shot.bind(question="Why?").trace().last_node.print_graph_dfs()
    assert "Constant('Q: Why?\\nA:')" in graph and "Argument" not in graph


def test_fork_is_traced_as_branches():
    @sgl.function
    def branches(s):
        s += "Start."
        forks = s.fork(2)
        forks += lambda i: f"Branch {i}:" + sgl.gen("x", max_tokens=4)
        forks.join()

    tracer = branches.trace()
    graph = tracer.print_graph()
    assert "Fork(" in graph and "GetForkItem(" in graph and graph.count("Gen('x')") == 2


def test_prefix_stops_at_the_first_non_constant():
    assert extract_prefix_by_tracing(few_shot, BaseBackend()) == "Shots shots shots.\nQ: "


def test_prefix_includes_rendered_roles_and_survives_fstrings():
    @sgl.function
    def chat(s, name):
        s += sgl.system("Be kind.")
        with s.user():
            s += f"Hello {name}"

    backend = BaseBackend(get_chat_template("chatml"))
    prefix = extract_prefix_by_tracing(chat, backend)
    assert prefix == "<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\n"


def test_cache_prefills_the_traced_prefix_once():
    class Recorder(BaseBackend):
        def __init__(self):
            super().__init__()
            self.cached = []

        def cache_prefix(self, prefix):
            self.cached.append(prefix)

    backend = Recorder()
    assert few_shot.cache(backend=backend) == "Shots shots shots.\nQ: "
    assert backend.cached == ["Shots shots shots.\nQ: "]
