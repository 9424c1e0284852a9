"""Tree of thought with ``fork``: propose several first steps in parallel branches (their
requests batch together and share the cached conversation), let each branch judge its idea
with ``select``, then continue from the best one.
Run: ``python examples/tree_of_thought.py [--url URL]``
"""

from __future__ import annotations

from _backend import backend_from_args

import radixlm as sgl

QUESTION = "Anna has 3 boxes with 4 apples each. She eats 2 apples. How many apples are left?"


@sgl.function
def tree_of_thought(s, question, width=3):
    s += sgl.user(question + " Give one short first step towards the answer.")
    branches = s.fork(width)
    branches += lambda i: (
        sgl.assistant(sgl.gen("idea", max_tokens=40, temperature=0.7))
        + sgl.user("Is that step correct? Answer yes or no.")
        + sgl.assistant(sgl.select("verdict", choices=["yes", "no"]))
    )
    branches.join()
    ranked = sorted(zip(s["verdict"], s["idea"]), key=lambda vi: vi[0] != "yes")
    s += sgl.assistant(ranked[0][1])
    s += sgl.user("So how many apples are left? Reply with just the number.")
    s += sgl.assistant(sgl.gen_int("answer", max_tokens=4))


def main() -> None:
    _, backend = backend_from_args(__doc__)
    state = tree_of_thought.run(question=QUESTION)
    for idea, verdict in zip(state["idea"], state["verdict"]):
        print(f"[{verdict:>3}] {idea.strip()}")
    print("answer:", state["answer"], "(expected 10)")
    backend.shutdown()


if __name__ == "__main__":
    main()
