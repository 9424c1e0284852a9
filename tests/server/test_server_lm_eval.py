"""lm-evaluation-harness, unchanged, against ``radixlm serve``: its ``local-completions`` model
with both tokenizer backends (``remote``: our /tokenizer_info, /tokenize, /detokenize;
``huggingface``: token-id prompts), on a loglikelihood and a generate_until task of local data,
against lm-eval's own ``hf`` model on the same weights."""

from __future__ import annotations

import json
import os

import pytest

lm_eval = pytest.importorskip("lm_eval", reason="needs the eval extra (lm-eval)")

from server_helpers import flush_and_check_no_leak, launch_server  # noqa: E402

SUBJECTS = ["cats", "rivers", "stars", "trains", "songs", "forests", "ships", "clocks"]
VERBS = ["sleep", "flow", "shine", "run", "play", "grow", "sail", "tick"]


def _write_tasks(root) -> str:
    """A 2-shot multiple-choice task (every doc's choices share its context, every doc the
    few-shot prefix) and a short generate_until task, as lm-eval YAML over local JSON lines."""
    docs = [
        {"question": f"What do {s} do at night?", "choices": [f" they {v}" for v in VERBS[:4]],
         "answer": i % 4}
        for i, s in enumerate(SUBJECTS)
    ]  # fmt: skip
    data = root / "docs.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    common = (
        f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\nfewshot_split: test\nfewshot_config:\n  sampler: first_n\n"
    )
    (root / "mc.yaml").write_text(
        "task: radixlm_mc\n" + common + "output_type: multiple_choice\nnum_fewshot: 2\n"
        'doc_to_text: "Question: {{question}}\\nAnswer:"\ndoc_to_choice: "{{choices}}"\n'
        "doc_to_target: answer\nmetric_list:\n  - metric: acc\n"
    )
    (root / "gen.yaml").write_text(
        "task: radixlm_gen\n" + common + "output_type: generate_until\n"
        'doc_to_text: "Question: {{question}}\\nAnswer:"\ndoc_to_target: "{{choices[0]}}"\n'
        "generation_kwargs:\n  until: [\"\\n\"]\n  max_gen_toks: 6\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n"
    )
    return str(root)


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    return _write_tasks(tmp_path_factory.mktemp("lm-eval-tasks"))


@pytest.fixture(scope="module")
def eval_server(tiny_llama):
    server = launch_server(tiny_llama, "--served-model-name", "tiny", "--max-total-tokens", "8192")
    yield server
    try:
        with server.client() as client:
            flush_and_check_no_leak(client)
    finally:
        server.stop()


def _evaluate(tasks: str, model: str, model_args: str) -> dict:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    return simple_evaluate(
        model=model, model_args=model_args, tasks=["radixlm_mc", "radixlm_gen"],
        task_manager=TaskManager(include_path=tasks), log_samples=True, random_seed=0,
        numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0,
    )  # fmt: skip


def _loglikelihoods(result: dict) -> list[float]:
    samples = sorted(result["samples"]["radixlm_mc"], key=lambda s: s["doc_id"])
    return [float(r[0]) for s in samples for r in s["filtered_resps"]]


def _generations(result: dict) -> list[str]:
    samples = sorted(result["samples"]["radixlm_gen"], key=lambda s: s["doc_id"])
    return [s["filtered_resps"][0] for s in samples]


@pytest.fixture(scope="module")
def reference(tasks, tiny_llama):
    """lm-eval's own ``hf`` model in float32 on the same checkpoint."""
    return _evaluate(tasks, "hf", f"pretrained={tiny_llama},dtype=float32,device=cpu")


@pytest.mark.parametrize("backend", ["remote", "huggingface"])
def test_lm_eval_local_completions_matches_its_hf_model(
    tasks, eval_server, reference, tiny_llama, backend
):
    url = f"{eval_server.url}/v1/completions"
    args = f"model=tiny,base_url={url},tokenizer_backend={backend},num_concurrent=4,max_retries=1"
    if backend == "huggingface":
        args += f",tokenizer={tiny_llama}"
    with eval_server.client() as client:
        client.post("/flush_cache")
        before = client.get("/get_server_info").json()["stats"]
    got = _evaluate(tasks, "local-completions", args)
    ours, want = _loglikelihoods(got), _loglikelihoods(reference)
    assert len(ours) == len(want) == len(SUBJECTS) * 4
    assert ours == pytest.approx(want, abs=2e-3)
    acc = "acc,none"
    assert got["results"]["radixlm_mc"][acc] == reference["results"]["radixlm_mc"][acc]
    assert _generations(got) == _generations(reference)
    with eval_server.client() as client:
        after = client.get("/get_server_info").json()["stats"]
    # NOTE: the choices share their question's context and every question the 2-shot prefix:
    # the echo requests' prompt logprobs come mostly from the radix cache
    reused = after["prompt_logprob_hit_tokens"] - before["prompt_logprob_hit_tokens"]
    queried = after["queried_tokens"] - before["queried_tokens"]
    assert reused > 0.7 * queried  # 1336 of 1664 when written
