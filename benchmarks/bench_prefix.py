"""The workload radixlm exists for: a shared few-shot prefix (~800 tokens) and many questions.

radixlm with the radix cache, radixlm without it, Hugging Face ``generate()`` batched (fp32),
llama.cpp (``llama-cpp-python``, same GGUF, reusing the common prefix's KV) when installed, and
vLLM's CPU build (its prefix cache on; see ``vllm_peer.py``) when its venv is there, twice when
radixlm's scheduler widens its pool for big steps: with radixlm's threads for small steps
(``vllm_cpu``; on 2 cores one, vLLM's own default) and with every core (``vllm_cpu_all_cores``),
since radixlm runs its prefills on every core; all greedy, 8 new tokens. radixlm's and vLLM's
rows are the best of ``RUNS`` runs (one engine start each), the others of one.
Run: ``.venv/bin/python benchmarks/bench_prefix.py [--sizes 32 128] [--skip-vllm]``
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import bar_chart, log, save, wait_compiled  # noqa: E402
from prefix_workload import prompts  # noqa: E402

NEW_TOKENS = 8
RUNS = 2  # NOTE: radixlm's and vLLM's rows are the best of this many runs (a shared machine)


def run_radixlm(batch: list[str], runs: int = RUNS, **options) -> dict:
    from radixlm import Engine

    # NOTE: bench_offline's pool size, so that both find the same compiled steps on disk
    with Engine(max_total_tokens=16384, **options) as engine:
        engine.generate("warm up", {"max_new_tokens": 2})
        wait_compiled(engine)
        elapsed = float("inf")
        for _ in range(runs):
            engine.flush_cache()
            start = time.perf_counter()
            outs = engine.generate(batch, {"max_new_tokens": NEW_TOKENS, "temperature": 0})
            elapsed = min(elapsed, time.perf_counter() - start)
        stats = engine.get_server_info()["stats"]
    cached = sum(o["meta_info"]["cached_tokens"] for o in outs)
    prompt = sum(o["meta_info"]["prompt_tokens"] for o in outs)
    return {
        "seconds": elapsed,
        "req_s": len(batch) / elapsed,
        "hit_rate": cached / prompt,
        "scheduler_hit_rate": stats["cache_hit_rate"],
        "answers": [o["text"] for o in outs[:3]],
    }


def run_hf(batch: list[str], batch_size: int = 16) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from radixlm.runtime.loader.gguf_loader import gguf_tokenizer
    from radixlm.runtime.loader.model_files import default_model_path

    path = default_model_path()
    tok = gguf_tokenizer(path)
    tok.padding_side = "left"
    tok.pad_token = tok.pad_token or tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32
    ).eval()
    start = time.perf_counter()
    texts = []
    with torch.no_grad():
        for i in range(0, len(batch), batch_size):
            enc = tok(batch[i : i + batch_size], return_tensors="pt", padding=True)
            out = model.generate(
                **enc, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=tok.pad_token_id
            )
            texts += tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    elapsed = time.perf_counter() - start
    return {"seconds": elapsed, "req_s": len(batch) / elapsed, "answers": texts[:3]}


def run_llamacpp(batch: list[str]) -> dict | None:
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    from radixlm.runtime.loader.model_files import default_model_path

    llm = Llama(
        model_path=default_model_path(), n_ctx=2048, n_threads=os.cpu_count(), verbose=False
    )
    # NOTE: llama.cpp keeps the previous prompt's KV and re-evaluates only past the longest common
    # prefix, which serves this workload far better than its LlamaRAMCache (a whole-state
    # save/restore per call, ~60x slower here), so the baseline runs without the latter.
    start = time.perf_counter()
    texts = [llm(p, max_tokens=NEW_TOKENS, temperature=0.0)["choices"][0]["text"] for p in batch]
    elapsed = time.perf_counter() - start
    return {"seconds": elapsed, "req_s": len(batch) / elapsed, "answers": texts[:3]}


def run_vllm(batches: dict[int, list[str]], threads: int) -> tuple[dict[int, dict], dict] | None:
    """vLLM's result for each batch (one vLLM start for all) with ``threads`` model threads, and
    its run's facts (version, startup, threads), or None when absent."""
    import vllm_peer

    runs = [{"prompts": b, "max_tokens": NEW_TOKENS, "ignore_eos": False} for b in batches.values()]
    out = vllm_peer.run([r for r in runs for _ in range(RUNS)], threads)
    if out is None:
        return None
    done = out.pop("runs")
    results = {}
    for i, n in enumerate(batches):
        r = min(done[i * RUNS : (i + 1) * RUNS], key=lambda r: r["seconds"])
        results[n] = {
            "seconds": r["seconds"],
            "req_s": n / r["seconds"],
            "hit_rate": r["cached_tokens"] / r["prompt_tokens"],
            "answers": r["answers"],
        }
    return results, out


VLLM_ROWS = ("vllm_cpu", "vllm_cpu_all_cores")


def vllm_thread_counts(skip: bool) -> dict[str, int]:
    """vLLM's runs: with radixlm's threads for small steps (on 2 cores also vLLM's own default,
    one model thread), and when radixlm's big steps take more, with that many as well."""
    from radixlm.runtime import threads

    if skip:
        return {}
    small, big = threads.compute_threads(None, 1), threads.big_step_threads(None, 1)
    return dict(zip(VLLM_ROWS, [small] if big == small else [small, big]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", type=int, nargs="+", default=[32, 128])
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--skip-llamacpp", action="store_true")
    ap.add_argument("--skip-vllm", action="store_true")
    args = ap.parse_args()
    results: dict[str, dict] = {}
    for n in args.sizes:
        batch = prompts(n)
        runs = {
            "radixlm": lambda b=batch: run_radixlm(b),
            "radixlm_no_radix": lambda b=batch: run_radixlm(b, 1, disable_radix_cache=True),
            "hf_generate_fp32": None if args.skip_hf else (lambda b=batch: run_hf(b)),
            "llama_cpp": None if args.skip_llamacpp else (lambda b=batch: run_llamacpp(b)),
        }
        for name, fn in runs.items():
            if fn is None:
                continue
            log(f"{name}, {n} questions")
            result = fn()
            if result is not None:
                results[f"{name}@{n}"] = result
                log(f"  {result['req_s']:.2f} req/s")
    extra = {}
    for name, count in vllm_thread_counts(args.skip_vllm).items():
        log(f"{name} ({count} threads), {' and '.join(map(str, args.sizes))} questions")
        vllm = run_vllm({n: prompts(n) for n in args.sizes}, count)
        if vllm is None:
            break
        for n, result in vllm[0].items():
            results[f"{name}@{n}"] = result
            log(f"  {n} questions: {result['req_s']:.2f} req/s")
        extra[name] = vllm[1]
    ratios = {}
    for n in args.sizes:
        ours = results[f"radixlm@{n}"]["req_s"]
        others = ("radixlm_no_radix", "hf_generate_fp32", "llama_cpp", *VLLM_ROWS)
        for other in others:
            if f"{other}@{n}" in results:
                ratios[f"vs_{other}@{n}"] = ours / results[f"{other}@{n}"]["req_s"]
    save("bench_prefix", {"args": vars(args), "results": results, "ratios": ratios, **extra})
    bar_chart(
        "bench_prefix",
        list(results),
        [r["req_s"] for r in results.values()],
        "requests / s",
        "Shared ~800-token few-shot prefix, 8 new tokens, CPU",
    )
    n = max(args.sizes)
    parts = [
        f"radixlm {results[f'radixlm@{n}']['req_s']:.2f} req/s",
        f"hit rate {results[f'radixlm@{n}']['hit_rate']:.1%}",
    ]
    parts += [f"{k.removeprefix('vs_')} x{v:.1f}" for k, v in ratios.items() if k.endswith(f"@{n}")]
    print(f"bench_prefix (@{n}): " + ", ".join(parts))


if __name__ == "__main__":
    main()
