"""Function calling: tool_choice auto (free text, parsed afterwards: what vLLM and llama.cpp do
by default) vs required (the grammar), jump-forward on and off, outlines and llguidance.

``radixlm serve`` on the embedded SmolLM2 (whose template has no tool support: the built-in
hermes prompt), the 56 requests of tool_workload.py (4-8 tools each) through the official openai
client, 8 at a time, greedy, one call per answer. Per configuration: parse rate (a call came
back), schema-valid rate (every call names an offered tool and its arguments validate), right-
tool rate, latency per request, and the grammar compile paid once per tool set (warm-up).
Run: ``.venv/bin/python benchmarks/bench_tools.py [--requests 56]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jsonschema  # noqa: E402
import openai  # noqa: E402
from bench_serving import launched, served_model  # noqa: E402
from common import bar_chart, log, save  # noqa: E402
from tool_workload import TOOL_SETS, requests  # noqa: E402

CONFIGS = [
    # (label, tool_choice, server flags)
    ("auto, parse only", "auto", []),
    ("required, grammar", "required", []),
    ("required, grammar, no jump-forward", "required", ["--disable-jump-forward"]),
    ("required, grammar (llguidance)", "required", ["--grammar-backend", "llguidance"]),
]


def ask(client: openai.OpenAI, model: str, prompt: str, tools: list[dict], choice: str) -> dict:
    start = time.perf_counter()
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], tools=tools,
        tool_choice=choice, parallel_tool_calls=False, temperature=0, max_tokens=160,
    )
    return {"seconds": time.perf_counter() - start, "message": r.choices[0].message,
            "tokens": r.usage.completion_tokens, "finish": r.choices[0].finish_reason}


def judge(result: dict, tools: list[dict], expected: str) -> dict:
    calls = result["message"].tool_calls or []
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    valid = bool(calls)
    for c in calls:
        try:
            jsonschema.validate(json.loads(c.function.arguments), schemas[c.function.name])
        except (KeyError, ValueError, jsonschema.ValidationError):
            valid = False
    right = bool(calls) and calls[0].function.name == expected
    return {"parsed": bool(calls), "valid": valid, "right_tool": right}


def run_config(url: str, choice: str, reqs: list[tuple]) -> dict:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=600)
    model = served_model(url)
    warm = time.perf_counter()
    for tools in TOOL_SETS:  # NOTE: compiles each tool set's grammar once (cached afterwards)
        ask(client, model, "Hello", tools, choice)
    warm = time.perf_counter() - warm
    start = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda r: ask(client, model, r[0], r[1], choice), reqs))
    seconds = time.perf_counter() - start
    verdicts = [judge(res, r[1], r[2]) for res, r in zip(results, reqs)]
    n = len(reqs)
    latencies = [r["seconds"] for r in results]
    return {
        "requests": n,
        "parse_rate": sum(v["parsed"] for v in verdicts) / n,
        "valid_rate": sum(v["valid"] for v in verdicts) / n,
        "right_tool_rate": sum(v["right_tool"] for v in verdicts) / n,
        "latency_mean_s": statistics.mean(latencies),
        "latency_p50_s": statistics.median(latencies),
        "completion_tokens_mean": statistics.mean(r["tokens"] for r in results),
        "requests_per_s": n / seconds,
        "warmup_s_4_tool_sets": warm,
        "invalid_examples": [
            {"prompt": r[0], "finish": res["finish"], "content": res["message"].content,
             "calls": [c.model_dump() for c in res["message"].tool_calls or []]}
            for res, r, v in zip(results, reqs, verdicts) if not v["valid"]
        ][:3],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=56)
    args = parser.parse_args()
    reqs = requests()[: args.requests]
    rows: dict[str, dict] = {}
    for label, choice, flags in CONFIGS:
        log(f"{label}: starting the server")
        with launched("radixlm", None, flags) as url:
            rows[label] = run_config(url, choice, reqs)
        r = rows[label]
        log(f"{label}: parse {r['parse_rate']:.0%}, valid {r['valid_rate']:.0%}, "
            f"right tool {r['right_tool_rate']:.0%}, latency {r['latency_mean_s']:.2f} s, "
            f"warm-up {r['warmup_s_4_tool_sets']:.1f} s")
    auto, grammar = rows[CONFIGS[0][0]], rows[CONFIGS[1][0]]
    speed = auto["latency_mean_s"] / grammar["latency_mean_s"]
    jf = rows[CONFIGS[2][0]]["latency_mean_s"] / grammar["latency_mean_s"]
    save("bench_tools", {"configs": rows, "grammar_vs_auto_latency_speedup": speed,
                         "jump_forward_speedup": jf})
    labels = list(rows)
    bar_chart("bench_tools", [f"radixlm {lb}" for lb in labels],
              [100 * rows[lb]["valid_rate"] for lb in labels], "schema-valid calls (%)",
              f"Tool calls on SmolLM2-135M, {len(reqs)} requests")
    print(f"bench_tools: valid {grammar['valid_rate']:.0%} with the grammar vs "
          f"{auto['valid_rate']:.0%} parse-only; grammar latency {speed:.2f}x auto's; "
          f"jump-forward {jf:.2f}x")


if __name__ == "__main__":
    main()
