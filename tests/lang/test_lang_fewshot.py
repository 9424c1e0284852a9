"""Few-shot QA with SmolLM2, and run_batch over 32 programs against 32 sequential runs."""

from __future__ import annotations

import radixlm as sgl
from tests.conftest import assert_no_leak

SHOTS = (
    "Q: What is the capital of France?\nA: Paris\n\n"
    "Q: What is the capital of Germany?\nA: Berlin\n\n"
    "Q: What is the capital of Italy?\nA: Rome\n\n"
    "Q: What is the capital of Spain?\nA: Madrid\n\n"
)
COUNTRIES = [
    "Japan", "the United Kingdom", "Canada", "Egypt", "Greece", "Russia", "China", "India",
    "Brazil", "Mexico", "Portugal", "Austria", "Poland", "Sweden", "Norway", "Ireland",
    "Kenya", "Peru", "Chile", "Cuba", "Turkey", "Iran", "Iraq", "Israel", "Thailand",
    "Vietnam", "Finland", "Denmark", "Belgium", "Hungary", "Argentina", "Australia",
]


@sgl.function
def capital_qa(s, country):
    s += SHOTS
    s += "Q: What is the capital of " + country + "?\nA:"
    s += sgl.gen("answer", max_tokens=3, stop="\n")


def test_few_shot_answers_tokyo_and_london(smol):
    japan = capital_qa.run(country="Japan", temperature=0, backend=smol)
    uk = capital_qa.run(country="the United Kingdom", temperature=0, backend=smol)
    assert japan["answer"].strip() == "Tokyo"
    assert uk["answer"].strip() == "London"
    assert japan.text().endswith("A: Tokyo")


def test_set_default_backend_accepts_an_engine(smol_engine):
    sgl.set_default_backend(smol_engine)
    try:
        state = capital_qa.run(country="Japan", temperature=0)
        assert state["answer"].strip() == "Tokyo"
    finally:
        sgl.set_default_backend(None)


def test_run_batch_equals_sequential_runs_and_reuses_the_prefix(smol, smol_engine, capsys):
    n_prefix = len(smol_engine.tokenizer.encode(SHOTS))
    smol.flush_cache()
    sequential = [capital_qa.run(country=c, temperature=0, backend=smol) for c in COUNTRIES]
    seq_cached = [s.get_meta_info("answer")["cached_tokens"] for s in sequential]
    assert seq_cached[0] == 0 and min(seq_cached[1:]) >= n_prefix - 1

    smol.flush_cache()
    batch = capital_qa.run_batch(
        [{"country": c} for c in COUNTRIES], temperature=0, backend=smol, progress_bar=True
    )
    assert "32/32" in capsys.readouterr().err
    assert [s["answer"] for s in batch] == [s["answer"] for s in sequential]
    assert all(s.error() is None for s in batch)
    batch_cached = [s.get_meta_info("answer")["cached_tokens"] for s in batch]
    assert min(batch_cached) >= n_prefix - 1  # the traced prefix was cached before dispatch
    assert_no_leak(smol_engine)


def test_run_batch_generator_style_yields_states_in_order(smol):
    states = capital_qa.run_batch(
        [{"country": "Japan"}, ("the United Kingdom",)], temperature=0, backend=smol,
        generator_style=True,
    )
    assert [s["answer"].strip() for s in states] == ["Tokyo", "London"]
