"""Shared-prefix serving through Ray Serve: radixlm's prefix-affinity router vs Ray's default
power-of-two router (2 replicas each) vs one replica, on a local Ray cluster.

The workload: ``--groups`` few-shot headers of ``--shots`` examples, ``--per-group`` questions
each, shuffled, sent ``--concurrency`` at a time as streaming ``/generate`` requests through
Ray's HTTP proxy (greedy, ``--new-tokens`` tokens). Each replica's KV cache holds about half of
the headers, so where a request lands decides whether its prefix is still cached.
Reports req/s, TTFT p50/p99 and the replicas' cache hit rate.
Run: ``.venv/bin/python benchmarks/bench_cluster.py`` (needs the ray extra)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import httpx  # noqa: E402
from bench_serving import free_port  # noqa: E402
from common import bar_chart, log, save  # noqa: E402
from prefix_workload import few_shot_prefix, questions  # noqa: E402

CONFIGS = {  # name -> (replicas, RayOptions extras, load_balance_method)
    "prefix_affinity": (2, {}, "cache_aware"),
    "power_of_two": (2, {"power_of_two_router": True}, "cache_aware"),
    "one_replica": (1, {}, "cache_aware"),
}


def workload(groups: int, per_group: int, shots: int, seed: int = 0) -> list[str]:
    """``groups`` few-shot headers (a different seed each), ``per_group`` questions each."""
    prompts = [few_shot_prefix(shots, seed=100 + g) + q
               for g in range(groups) for q in questions(per_group, seed=g)]  # fmt: skip
    random.Random(seed).shuffle(prompts)
    return prompts


def ttft_of(client: httpx.Client, prompt: str, new_tokens: int) -> float:
    body = {"text": prompt, "stream": True,
            "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0}}  # fmt: skip
    start = time.perf_counter()
    first = None
    with client.stream("POST", "/generate", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data:") and first is None and line != "data: [DONE]":
                if json.loads(line[5:])["output_ids"]:
                    first = time.perf_counter() - start
    return first if first is not None else time.perf_counter() - start


def run_config(name: str, url: str, prompts: list[str], args) -> dict:
    from ray import serve

    from radixlm.deploy.ray import APP_NAME, RayOptions, build_app
    from radixlm.runtime.config import ServerArgs

    replicas, extra, policy = CONFIGS[name]
    engine = ServerArgs(num_threads=max(1, (os.cpu_count() or 2) // replicas),
                        max_total_tokens=args.kv_tokens, load_balance_method=policy)  # fmt: skip
    log(f"{name}: deploying {replicas} replica(s)")
    serve.run(build_app(engine, RayOptions(num_replicas=replicas, **extra)), name=APP_NAME,
              route_prefix="/")  # fmt: skip
    with httpx.Client(base_url=url, timeout=300) as client:
        ttft_of(client, "warm up", 2)
        client.post("/flush_cache").raise_for_status()
        start = time.perf_counter()
        with ThreadPoolExecutor(args.concurrency) as pool:
            ttfts = list(pool.map(lambda p: ttft_of(client, p, args.new_tokens), prompts))
        elapsed = time.perf_counter() - start
        stats = client.get("/get_server_info").json()["stats"]
    serve.delete(APP_NAME)
    ttfts.sort()
    result = {
        "replicas": replicas,
        "seconds": elapsed,
        "req_s": len(prompts) / elapsed,
        "ttft_p50_s": statistics.median(ttfts),
        "ttft_p99_s": ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))],
        "hit_rate": stats["cache_hit_rate"],
    }
    log(f"  {result['req_s']:.2f} req/s, TTFT p50 {result['ttft_p50_s']:.2f} s, "
        f"hit rate {result['hit_rate']:.1%}")  # fmt: skip
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--groups", type=int, default=6)
    ap.add_argument("--per-group", type=int, default=12)
    ap.add_argument("--shots", type=int, default=10, help="few-shot examples per header")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--kv-tokens", type=int, default=1024, help="KV cache size of each replica")
    args = ap.parse_args()
    import ray
    from ray import serve

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    prompts = workload(args.groups, args.per_group, args.shots)
    try:
        results = {name: run_config(name, f"http://127.0.0.1:{port}", prompts, args)
                   for name in CONFIGS}  # fmt: skip
    finally:
        serve.shutdown()
        ray.shutdown()
    ours = results["prefix_affinity"]
    ratios = {f"vs_{k}": ours["req_s"] / v["req_s"] for k, v in results.items() if v is not ours}
    ratios["hit_rate_vs_power_of_two"] = ours["hit_rate"] / max(
        results["power_of_two"]["hit_rate"], 1e-9
    )
    save("bench_cluster", {"args": vars(args), "results": results, "ratios": ratios})
    bar_chart("bench_cluster", [f"radixlm_{k}" if k == "prefix_affinity" else k for k in results],
              [r["req_s"] for r in results.values()], "requests / s",
              "Shared-prefix serving through Ray Serve, CPU")  # fmt: skip
    print(
        f"bench_cluster: prefix affinity {ours['req_s']:.2f} req/s (hit rate "
        f"{ours['hit_rate']:.1%}, TTFT p50 {ours['ttft_p50_s']:.2f} s), "
        f"power-of-two x{ratios['vs_power_of_two']:.2f} (hit rate "
        f"{results['power_of_two']['hit_rate']:.1%}), one replica x{ratios['vs_one_replica']:.2f}"
    )


if __name__ == "__main__":
    main()
