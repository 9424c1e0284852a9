"""Few-shot evaluation: capital-city questions answered after a shared 4-shot prefix.

The shots are prefilled once (run_batch traces the program and caches its constant prefix);
every question then reuses them. Run: ``python examples/few_shot_eval.py [--url URL]``
"""

from __future__ import annotations

from _backend import backend_from_args

import radixlm as sgl

SHOTS = (
    "Q: What is the capital of France?\nA: Paris\n\n"
    "Q: What is the capital of Germany?\nA: Berlin\n\n"
    "Q: What is the capital of Italy?\nA: Rome\n\n"
    "Q: What is the capital of Spain?\nA: Madrid\n\n"
)
QUESTIONS = {
    "Japan": "Tokyo", "the United Kingdom": "London", "Canada": "Ottawa", "Egypt": "Cairo",
    "Greece": "Athens", "Russia": "Moscow", "China": "Beijing", "Portugal": "Lisbon",
}


@sgl.function
def capital_qa(s, country):
    s += SHOTS
    s += "Q: What is the capital of " + country + "?\nA:"
    s += sgl.gen("answer", max_tokens=4, stop="\n")


def main() -> None:
    _, backend = backend_from_args(__doc__)
    states = capital_qa.run_batch(
        [{"country": c} for c in QUESTIONS], temperature=0, progress_bar=True
    )
    correct = 0
    for (country, truth), state in zip(QUESTIONS.items(), states):
        answer = state["answer"].strip()
        correct += answer == truth
        cached = state.get_meta_info("answer")["cached_tokens"]
        print(f"{country:>20}: {answer:<12} ({'ok' if answer == truth else 'expected ' + truth}, "
              f"{cached} cached prompt tokens)")
    print(f"accuracy {correct}/{len(QUESTIONS)}")
    backend.shutdown()


if __name__ == "__main__":
    main()
