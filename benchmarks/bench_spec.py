"""N-gram speculative decoding on the embedded model, side by side in one run: tokens/s of
greedy decoding with speculation off and on (``--speculative-algorithm ngram``), single stream
and 4 at a time, on (a) extraction from a given document, (b) an agent restating a tool's output,
(c) free chat (ShareGPT first turns); the acceptance length; and llama.cpp with and without its
prompt-lookup decoding (``LlamaPromptLookupDecoding``) as the peer, single stream.

Off and on run in one engine, one after the other for each workload (off is the per-request
opt-out ``"speculative": false``), best of ``--repeats``, so both see the same compiled steps
and the same machine.
Run: ``.venv/bin/python benchmarks/bench_spec.py``
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_serving import sharegpt_requests  # noqa: E402
from common import bar_chart, log, save, wait_compiled  # noqa: E402

DOCUMENT = (
    "Invoice 4471 from Northwind Traders, dated 12 March 2024, is addressed to Contoso Ltd, "
    "42 Harbour Road, Portsmouth. It lists 3 items: 12 steel brackets at 4.50 each, 2 boxes of "
    "M6 bolts at 11.20 each, and 1 cordless drill at 89.99. The subtotal is 166.39, VAT at 20 "
    "percent is 33.28, and the total due is 199.67, payable within 30 days to account "
    "GB29 NWBK 6016 1331 9268 19. Contact: Maria Lopez, accounts@northwind.example."
)
TOOL_OUTPUT = (
    '{"city": "Lisbon", "forecast": [{"day": "Monday", "high_c": 24, "low_c": 16, "sky": '
    '"sunny"}, {"day": "Tuesday", "high_c": 22, "low_c": 15, "sky": "cloudy"}, {"day": '
    '"Wednesday", "high_c": 19, "low_c": 14, "sky": "rain"}], "source": "weather-api v2"}'
)
WORKLOADS = {
    "extraction": [
        f"Here is a document:\n{DOCUMENT}\n\nCopy the document above exactly, word for word.",
        f"Here is a document:\n{DOCUMENT}\n\nList every number in the document with its meaning.",
        f"Document:\n{DOCUMENT}\n\nRewrite the document as a bulleted list, keeping every detail.",
    ],
    "agent_tool_output": [
        f"The weather tool returned:\n{TOOL_OUTPUT}\nRepeat the tool output for the user, then "
        "say which day is warmest.",
        f"Tool result:\n{TOOL_OUTPUT}\nQuote each day's forecast exactly as the tool gave it.",
        f"get_weather returned {TOOL_OUTPUT}. Restate this JSON as a table.",
    ],
}


def chat_prompts(tokenizer, questions: list[str]) -> list[str]:
    def render(q: str) -> str:
        messages = [{"role": "user", "content": q}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    return [render(q) for q in questions]


def run_radixlm(prompts: dict[str, list[str]], new_tokens: int, repeats: int) -> dict:
    """{"radixlm_off": ..., "radixlm_ngram": ...}: per workload the best single-stream and
    4-at-a-time tok/s of ``repeats`` runs and the single-stream texts."""
    from radixlm import Engine

    out: dict[str, dict] = {"radixlm_off": {}, "radixlm_ngram": {}}
    with Engine(max_total_tokens=16384, speculative_algorithm="ngram") as engine:
        engine.generate("warm up", {"max_new_tokens": 4})
        wait_compiled(engine)

        def timed(batch: list[str], params: dict, together: bool) -> tuple[float, list[str]]:
            engine.flush_cache()  # NOTE: no drafts from answers given before
            start = time.perf_counter()
            rs = engine.generate(batch, params) if together else [
                engine.generate(p, params) for p in batch
            ]
            tokens = sum(r["meta_info"]["completion_tokens"] for r in rs)
            return tokens / (time.perf_counter() - start), [r["text"] for r in rs]

        for name, batch in prompts.items():
            for run, spec in (("radixlm_off", False), ("radixlm_ngram", True)):
                greedy = {"max_new_tokens": new_tokens, "temperature": 0, "speculative": spec}
                single = batch4 = 0.0
                for _ in range(repeats):
                    tok_s, texts = timed(batch, greedy, together=False)
                    single = max(single, tok_s)
                    batch4 = max(batch4, timed((batch * 2)[:4], greedy, together=True)[0])
                out[run][name] = {"single_tok_s": single, "batch4_tok_s": batch4, "texts": texts}
                log(f"  {run} {name}: single {single:.1f} tok/s, batch-4 {batch4:.1f}")
        stats = engine.get_server_info()["stats"]
    out["radixlm_ngram"]["spec_stats"] = {k: v for k, v in stats.items() if k.startswith("spec_")}
    return out


def run_llamacpp(prompts: dict[str, list[str]], new_tokens: int, lookup: bool) -> dict | None:
    try:
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    except ImportError:
        return None
    from radixlm.runtime.loader.model_files import default_model_path

    draft = LlamaPromptLookupDecoding(num_pred_tokens=4) if lookup else None
    # NOTE: every core, as users run it
    llm = Llama(model_path=default_model_path(), n_ctx=2048, verbose=False, draft_model=draft,
                n_threads=os.cpu_count())  # fmt: skip
    out = {}
    for name, batch in prompts.items():
        start, tokens = time.perf_counter(), 0
        for p in batch:
            r = llm(p, max_tokens=new_tokens, temperature=0.0)
            tokens += r["usage"]["completion_tokens"]
        out[name] = {"single_tok_s": tokens / (time.perf_counter() - start)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--chat-prompts", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--skip-llamacpp", action="store_true")
    args = ap.parse_args()
    from radixlm.runtime.loader.gguf_loader import gguf_tokenizer
    from radixlm.runtime.loader.model_files import default_model_path

    tok = gguf_tokenizer(default_model_path())
    chat = [p for p, _ in sharegpt_requests(args.chat_prompts, args.new_tokens, 600, seed=0)]
    prompts = {name: chat_prompts(tok, qs) for name, qs in {**WORKLOADS, "chat": chat}.items()}
    log("radixlm (off and ngram)")
    results = run_radixlm(prompts, args.new_tokens, args.repeats)
    runs = {
        "llama_cpp": lambda: run_llamacpp(prompts, args.new_tokens, False),
        "llama_cpp_lookup": lambda: run_llamacpp(prompts, args.new_tokens, True),
    }
    if args.skip_llamacpp:
        runs = {k: v for k, v in runs.items() if not k.startswith("llama")}
    for name, fn in runs.items():
        log(name)
        result = fn()
        if result is not None:
            results[name] = result
            log("  " + ", ".join(f"{k} {v['single_tok_s']:.1f} tok/s" for k, v in result.items()
                                 if "single_tok_s" in v))  # fmt: skip
    off, on = results["radixlm_off"], results["radixlm_ngram"]
    same_by_workload = {w: off[w].pop("texts") == on[w].pop("texts") for w in prompts}
    same = all(same_by_workload.values())
    ratios = {}
    for w in prompts:
        ratios[f"single_{w}"] = on[w]["single_tok_s"] / off[w]["single_tok_s"]
        ratios[f"batch4_{w}"] = on[w]["batch4_tok_s"] / off[w]["batch4_tok_s"]
        if "llama_cpp_lookup" in results:
            peer = results["llama_cpp_lookup"][w]["single_tok_s"]
            ratios[f"llama_cpp_lookup_single_{w}"] = peer / results["llama_cpp"][w]["single_tok_s"]
            ratios[f"single_{w}_vs_llama_cpp_lookup"] = on[w]["single_tok_s"] / peer
    spec = on["spec_stats"]
    accept = spec["spec_accepted_tokens"] / max(spec["spec_steps"], 1)
    save("bench_spec", {"args": vars(args), "results": results, "ratios": ratios,
                        "same_greedy_text": same_by_workload,
                        "mean_accepted_per_step": accept})  # fmt: skip
    labels, values = [], []
    for w in prompts:
        for name in results:
            if w in results[name]:
                labels.append(f"{name}:{w}")
                values.append(results[name][w]["single_tok_s"])
    bar_chart("bench_spec", labels, values, "tokens / s (single stream)",
              "N-gram speculative decoding, CPU")  # fmt: skip
    print(
        "bench_spec: single stream x" + ", x".join(
            f"{ratios[f'single_{w}']:.2f} ({w})" for w in prompts
        ) + ", batch-4 x" + ", x".join(f"{ratios[f'batch4_{w}']:.2f}" for w in prompts)
        + f"; {accept:.2f} draft tokens accepted per drafted step; same greedy text {same}"
    )


if __name__ == "__main__":
    main()
