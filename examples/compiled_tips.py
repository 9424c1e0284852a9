"""A compiled program (SGLang's ``compile()``): the program's code is traced once into a graph;
the two programs it calls become streams of their own that generate concurrently, and
``run_batch`` executes the graph for several topics without running the Python code again.
Run: ``python examples/compiled_tips.py [--url URL]``
"""

from __future__ import annotations

from _backend import backend_from_args

import radixlm as sgl


@sgl.function
def expand(s, tip):
    s += sgl.user("Explain this tip in one detailed sentence: " + tip)
    s += sgl.assistant(sgl.gen("detailed_tip", max_tokens=40, stop="\n"))


@sgl.function
def tip_suggestion(s, topic):
    s += "Here are 2 short tips for " + topic + ".\n"
    s += "1." + sgl.gen("tip_1", max_tokens=16, stop=["\n", ":", "."]) + "\n"
    s += "2." + sgl.gen("tip_2", max_tokens=16, stop=["\n", ":", "."]) + "\n"
    branch1 = expand(tip=s["tip_1"])  # traced as a stream that waits for tip_1 only
    branch2 = expand(tip=s["tip_2"])
    s += "Tip 1:" + branch1["detailed_tip"] + "\n"
    s += "Tip 2:" + branch2["detailed_tip"] + "\n"
    s += "In summary," + sgl.gen("summary", max_tokens=30, stop="\n")


def main() -> None:
    _, backend = backend_from_args(__doc__)
    compiled = tip_suggestion.compile()
    compiled.print_graph()
    states = compiled.run_batch(
        [{"topic": "staying healthy"}, {"topic": "learning to cook"}], temperature=0
    )
    for state in states:
        print("\n" + state.text())
    backend.shutdown()


if __name__ == "__main__":
    main()
