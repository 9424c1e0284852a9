"""Offline decode speed: the Engine (bf16 with compiled and with eager decode steps, bf16 with
``low_memory`` and its ahead-of-time compiled decode, fp32) against Hugging Face ``generate()``
(fp32, bf16), llama.cpp (the same Q4_1 GGUF, llama-cpp-python) and, when its venv is there,
vLLM's CPU build (bf16, the GGUF dequantized; see ``vllm_peer.py``).

Single-stream decode tok/s (best of 3 runs) and batch-32 aggregate throughput (best of 2, each
on prompts new from their first token) on the embedded SmolLM2 (llama.cpp decodes the 32
sequences together in one context, as its server does with 32 parallel slots), and the
busy-machine variant: single-stream again while another process keeps one core busy.
llama.cpp and vLLM run at their own best setting, every core (``--threads``, default the
machine's cores; llama.cpp decodes SmolLM2 faster on 2 threads than on 1), radixlm at its
default. vLLM batches the prompts itself. The ``single_vs_*``
and ``batch32_vs_*`` ratios take radixlm's best mode; ``default_*`` and ``low_memory_*`` name one.
Run: ``.venv/bin/python benchmarks/bench_offline.py [--new-tokens 128] [--batch 32] [--skip-vllm]``
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from common import bar_chart, log, save, wait_compiled  # noqa: E402
from vllm_peer import busy_core  # noqa: E402

PROMPT = "Write a long story about a robot who learns to paint."
RUNS = 3  # NOTE: single-stream rows are the best of this many runs (~2 s each; a shared machine)
BATCH_RUNS = 2  # NOTE: batch rows (radixlm's, vLLM's) the best of this many, each on new prompts


def batch_prompts(batch: int, run: int) -> list[str]:
    """Run ``run``'s prompts: new from their first token on, so no engine's prefix cache keeps
    an earlier run's prefill (within a run, the 32 prompts share their opening as before)."""
    return [f"Take {run + 1}. {PROMPT} Variation {i}." for i in range(batch)]


def engine_runs(
    dtype: str, new_tokens: int, batch: int, busy: bool, compiled: bool, low_memory: bool = False
) -> dict[str, float]:
    from radixlm import Engine

    with Engine(dtype=dtype, max_total_tokens=16384, disable_cpu_compile=not compiled,
                low_memory=low_memory) as engine:  # fmt: skip
        p = {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
        engine.generate(PROMPT, {**p, "max_new_tokens": 4})  # warm-up
        wait_compiled(engine)

        def single() -> float:
            engine.flush_cache()
            start = time.perf_counter()
            one = engine.generate(PROMPT, p)
            return one["meta_info"]["completion_tokens"] / (time.perf_counter() - start)

        out = {"single_tok_s": max(single() for _ in range(RUNS))}

        def many(run: int) -> float:
            engine.flush_cache()
            start = time.perf_counter()
            outs = engine.generate(batch_prompts(batch, run), p)
            total = sum(o["meta_info"]["completion_tokens"] for o in outs)
            return total / (time.perf_counter() - start)

        out[f"batch{batch}_tok_s"] = max(many(run) for run in range(BATCH_RUNS))
        if busy:
            with busy_core():
                out["busy_single_tok_s"] = max(single() for _ in range(RUNS))
    return out


def hf_single(dtype: torch.dtype, new_tokens: int) -> float:
    from transformers import AutoModelForCausalLM

    from radixlm.runtime.loader.gguf_loader import gguf_tokenizer
    from radixlm.runtime.loader.model_files import default_model_path

    path = default_model_path()
    tok = gguf_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=dtype
    ).eval()
    ids = torch.tensor([tok.encode(PROMPT)])
    with torch.no_grad():
        model.generate(ids, max_new_tokens=4, do_sample=False)
        start = time.perf_counter()
        out = model.generate(
            ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False
        )
        elapsed = time.perf_counter() - start
    return (out.shape[1] - ids.shape[1]) / elapsed


def llamacpp_runs(new_tokens: int, batch: int, threads: int) -> dict[str, float] | None:
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    from radixlm.runtime.loader.model_files import default_model_path

    llm = Llama(model_path=default_model_path(), n_ctx=1024, n_threads=threads, verbose=False)
    # NOTE: EOS banned so every run makes new_tokens tokens, like ignore_eos.
    p = {"max_tokens": new_tokens, "temperature": 0.0, "logit_bias": {llm.token_eos(): -1e9}}

    def single(run: int) -> float:
        start = time.perf_counter()
        made = llm(PROMPT + " " * run, **p)["usage"]["completion_tokens"]
        return made / (time.perf_counter() - start)

    single(0)  # warm-up
    best = max(single(run) for run in range(1, RUNS + 1))
    start = time.perf_counter()
    total = sum(map(len, llamacpp_parallel(llm, batch_prompts(batch, 0), new_tokens, threads)))
    out = {"single_tok_s": best, f"batch{batch}_tok_s": total / (time.perf_counter() - start)}
    with busy_core():
        out["busy_single_tok_s"] = max(single(run) for run in range(RUNS + 1, 2 * RUNS + 1))
    return out


def llamacpp_parallel(llm, prompts: list[str], new_tokens: int, threads: int) -> list[list[int]]:
    """What llama.cpp's server does with a slot per prompt (``--parallel``): every prompt's
    sequence in one context, prefilled in one batch, then one ``llama_decode`` per step over all
    of them, greedy with EOS banned; returns each prompt's new tokens."""
    import llama_cpp as lc
    import numpy as np

    seqs = [llm.tokenize(p.encode()) for p in prompts]
    n, prompt_tokens = len(seqs), sum(len(s) for s in seqs)
    params = lc.llama_context_default_params()
    params.n_seq_max = n
    params.n_ctx = n * -(-(max(map(len, seqs)) + new_tokens) // 256) * 256  # NOTE: per sequence
    params.n_batch = params.n_ubatch = max(prompt_tokens, n)
    params.n_threads = params.n_threads_batch = threads
    params.kv_unified = False  # NOTE: a KV stream per sequence: faster without a shared prefix
    ctx = lc.llama_init_from_model(llm.model, params)
    batch = lc.llama_batch_init(max(prompt_tokens, n), 0, 1)
    vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(llm.model))
    eos = llm.token_eos()

    def decode(entries: list[tuple[int, int, int, bool]]) -> None:
        batch.n_tokens = len(entries)
        for i, (token, pos, seq, logits) in enumerate(entries):
            batch.token[i], batch.pos[i], batch.logits[i] = token, pos, logits
            batch.n_seq_id[i], batch.seq_id[i][0] = 1, seq
        if lc.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")

    def greedy(row: int) -> int:
        logits = np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, row), shape=(vocab,))
        logits[eos] = -np.inf
        return int(logits.argmax())

    try:
        decode([(t, pos, i, pos == len(s) - 1) for i, s in enumerate(seqs)
                for pos, t in enumerate(s)])  # fmt: skip
        rows = list(np.cumsum([len(s) for s in seqs]) - 1)
        lens, made = [len(s) for s in seqs], [[] for _ in seqs]
        for step in range(new_tokens):
            nxt = [greedy(r) for r in rows]
            for out, t in zip(made, nxt):
                out.append(t)
            if step == new_tokens - 1:
                break
            decode([(t, lens[i], i, True) for i, t in enumerate(nxt)])
            rows, lens = list(range(n)), [x + 1 for x in lens]
    finally:
        lc.llama_batch_free(batch)
        lc.llama_free(ctx)
    return made


def vllm_runs(new_tokens: int, batch: int, threads: int) -> tuple[dict[str, float], dict] | None:
    """vLLM's rows (tok/s) and its run's facts (version, startup, threads), or None when
    absent."""
    import vllm_peer

    p = {"max_tokens": new_tokens, "ignore_eos": True}
    one, busy = {"prompts": [PROMPT], **p}, {"prompts": [PROMPT], **p, "busy": True}
    many = [{"prompts": batch_prompts(batch, run), **p} for run in range(BATCH_RUNS)]
    out = vllm_peer.run([*[one] * RUNS, *many, *[busy] * RUNS], threads)
    if out is None:
        return None
    rates = [r["completion_tokens"] / r["seconds"] for r in out.pop("runs")]
    batch_rates = rates[RUNS : RUNS + BATCH_RUNS]
    return {
        "single_tok_s": max(rates[:RUNS]), f"batch{batch}_tok_s": max(batch_rates),
        "busy_single_tok_s": max(rates[RUNS + BATCH_RUNS :]),
    }, out  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, help="llama.cpp's and vLLM's (default: every core)")
    ap.add_argument("--skip-vllm", action="store_true", help="leave out vLLM's CPU build")
    args = ap.parse_args()
    args.threads = args.threads or os.cpu_count()
    results: dict[str, dict] = {}
    for dtype, compiled in (("bfloat16", True), ("bfloat16", False), ("float32", True)):
        name = f"radixlm_{dtype}" + ("" if compiled else "_eager")
        log(name)
        busy = dtype == "bfloat16"  # NOTE: the default dtype on CPU
        results[name] = engine_runs(dtype, args.new_tokens, args.batch, busy, compiled)
    log("radixlm_bfloat16_low_memory")
    results["radixlm_bfloat16_low_memory"] = engine_runs(
        "bfloat16", args.new_tokens, args.batch, False, True, low_memory=True
    )  # NOTE: compiled: its ahead-of-time decode graphs (compiled once, then loaded from disk)
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        log(f"HF generate {name}")
        results[f"hf_{name}"] = {"single_tok_s": hf_single(dtype, args.new_tokens)}
    log("llama.cpp")
    llamacpp = llamacpp_runs(args.new_tokens, args.batch, args.threads)
    if llamacpp is not None:
        results["llama_cpp_q4_1"] = llamacpp
    vllm = None
    if not args.skip_vllm:
        log("vLLM (CPU)")
        vllm = vllm_runs(args.new_tokens, args.batch, args.threads)
    if vllm is not None:
        results["vllm_cpu"] = vllm[0]
    hf = results["hf_float32"]["single_tok_s"]
    best = max(results[k]["single_tok_s"] for k in results if k.startswith("radixlm"))
    batch_key = f"batch{args.batch}_tok_s"
    best_batch = max(results[k][batch_key] for k in results if k.startswith("radixlm"))
    ratios = {
        "single_vs_hf_fp32": best / hf,
        "single_vs_best_hf": best / max(r["single_tok_s"] for k, r in results.items() if "hf" in k),
        f"batch{args.batch}_vs_hf_single": best_batch / hf,
    }
    bf16 = results["radixlm_bfloat16"]
    ratios["busy_vs_idle"] = bf16["busy_single_tok_s"] / bf16["single_tok_s"]
    ratios["compiled_vs_eager_single"] = (
        bf16["single_tok_s"] / results["radixlm_bfloat16_eager"]["single_tok_s"]
    )
    low = results["radixlm_bfloat16_low_memory"]
    ratios["low_memory_vs_compiled_single"] = low["single_tok_s"] / bf16["single_tok_s"]
    ratios[f"low_memory_vs_compiled_batch{args.batch}"] = low[batch_key] / bf16[batch_key]
    if llamacpp is not None:
        ratios["single_vs_llama_cpp"] = best / llamacpp["single_tok_s"]
        ratios["low_memory_single_vs_llama_cpp"] = low["single_tok_s"] / llamacpp["single_tok_s"]
        ratios["default_single_vs_llama_cpp"] = bf16["single_tok_s"] / llamacpp["single_tok_s"]
        ratios[f"batch{args.batch}_vs_llama_cpp"] = best_batch / llamacpp[batch_key]
        ratios["busy_single_vs_llama_cpp"] = (
            bf16["busy_single_tok_s"] / llamacpp["busy_single_tok_s"]
        )
        ratios["llama_cpp_busy_vs_idle"] = (
            llamacpp["busy_single_tok_s"] / llamacpp["single_tok_s"]
        )
    if vllm is not None:
        theirs = results["vllm_cpu"]
        ratios["single_vs_vllm"] = best / theirs["single_tok_s"]
        ratios["default_single_vs_vllm"] = bf16["single_tok_s"] / theirs["single_tok_s"]
        ratios[f"batch{args.batch}_vs_vllm"] = best_batch / theirs[batch_key]
        ratios["busy_single_vs_vllm"] = bf16["busy_single_tok_s"] / theirs["busy_single_tok_s"]
        ratios["vllm_busy_vs_idle"] = theirs["busy_single_tok_s"] / theirs["single_tok_s"]
    extra = {"vllm": vllm[1]} if vllm is not None else {}
    save("bench_offline", {"args": vars(args), "results": results, "ratios": ratios, **extra})
    labels, values = [], []
    for k, r in results.items():
        for metric, v in r.items():
            labels.append(f"{k} {metric.replace('_tok_s', '')}")
            values.append(v)
    bar_chart("bench_offline", labels, values, "tokens / s", "Offline decode, SmolLM2-135M, CPU")
    batch_ratio = ratios[f"batch{args.batch}_vs_hf_single"]
    vs_cpp = (
        f", vs llama.cpp {ratios['single_vs_llama_cpp']:.2f}x single, "
        f"{ratios[f'batch{args.batch}_vs_llama_cpp']:.2f}x batch"
        if llamacpp is not None else ""
    )  # fmt: skip
    vs_vllm = (
        f", vs vLLM {ratios['single_vs_vllm']:.2f}x single, "
        f"{ratios[f'batch{args.batch}_vs_vllm']:.2f}x batch, "
        f"{ratios['busy_single_vs_vllm']:.2f}x busy"
        if vllm is not None else ""
    )  # fmt: skip
    print(
        f"bench_offline: single {best:.1f} tok/s ({ratios['single_vs_hf_fp32']:.2f}x HF fp32, "
        f"{ratios['single_vs_best_hf']:.2f}x best HF), batch-{args.batch} {best_batch:.1f} tok/s "
        f"({batch_ratio:.2f}x HF single){vs_cpp}{vs_vllm}; busy machine "
        f"{ratios['busy_vs_idle']:.2f}x of idle"
    )


if __name__ == "__main__":
    main()
