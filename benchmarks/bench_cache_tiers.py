"""The disk tier under the radix tree, on the embedded model, in one run:

1. a multi-turn agent workload whose working set is several times the KV pool: ``--sessions``
   agents, each with its own long system prompt and a growing history, served in turns (one
   request at a time, streamed); TTFT p50/p99 and requests/s with the memory tier only vs
   memory + disk (``--kv-disk-cache``);
2. a restart: TTFT of a ~4k-token prompt on a fresh engine, recomputed (cold) vs loaded from the
   disk tier a previous engine wrote;
3. the disk tier's load bandwidth beside this machine's file read bandwidth (page cache: a file
   just written, read back once).
Run: ``.venv/bin/python benchmarks/bench_cache_tiers.py``
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import bar_chart, log, save  # noqa: E402

WORDS = (
    "tool search fetch file read write plan step check result error retry user answer json "
    "field value list table report agent memory budget limit note task goal state done next"
).split()


def system_prompt(seed: int, words: int) -> str:
    rng = random.Random(seed)
    rules = " ".join(rng.choice(WORDS) for _ in range(words))
    return f"You are agent {seed}. Tools and rules: {rules}\n"


def ttft(engine, prompt: str, new_tokens: int) -> tuple[float, str]:
    start = time.perf_counter()
    first, text = None, ""
    for chunk in engine.generate(prompt, {"max_new_tokens": new_tokens, "temperature": 0},
                                 stream=True):  # fmt: skip
        if first is None and chunk["output_ids"]:
            first = time.perf_counter() - start
        text += chunk["text"]
    return (first if first is not None else time.perf_counter() - start), text


def agents(args, disk: str | None) -> dict:
    from radixlm import Engine

    kw = {"kv_disk_cache": disk} if disk else {}
    histories = [system_prompt(s, args.prompt_words) for s in range(args.sessions)]
    times, texts = [], []
    with Engine(max_total_tokens=args.pool_tokens, **kw) as engine:
        ttft(engine, "warm up", 2)
        start = time.perf_counter()
        for turn in range(args.turns):
            for s in range(args.sessions):
                histories[s] += f"User: turn {turn}, what is next?\nAssistant:"
                seconds, text = ttft(engine, histories[s], args.new_tokens)
                histories[s] += text + "\n"
                times.append(seconds)
                texts.append(text)
        elapsed = time.perf_counter() - start
        stats = engine.get_server_info()["stats"]
    times.sort()
    return {
        "requests": len(times),
        "req_s": len(times) / elapsed,
        "ttft_p50_s": statistics.median(times),
        "ttft_p99_s": times[min(len(times) - 1, int(0.99 * len(times)))],
        "hit_rate": stats["cache_hit_rate"],
        "disk_hit_tokens": stats.get("disk_hit_tokens", 0),
        "disk_load_s": stats.get("disk_load_s", 0.0),
        "disk_bytes_read": stats.get("disk_bytes_read", 0),
        "texts": texts,
    }


def restart(args, disk: str) -> dict:
    from radixlm import Engine

    prompt = system_prompt(99, args.restart_words) + "User: summarise the rules.\nAssistant:"
    out = {}
    with Engine(max_total_tokens=16384, kv_disk_cache=disk) as engine:
        out["cold_ttft_s"], cold_text = ttft(engine, prompt, 4)
        out["prompt_tokens"] = len(engine.tokenizer.encode(prompt))
    with Engine(max_total_tokens=16384, kv_disk_cache=disk) as engine:
        out["disk_ttft_s"], disk_text = ttft(engine, prompt, 4)
        stats = engine.get_server_info()["stats"]
    out["same_text"] = cold_text == disk_text
    out["disk_hit_tokens"] = stats["disk_hit_tokens"]
    out["load_mb_s"] = stats["disk_bytes_read"] / max(stats["disk_load_s"], 1e-9) / 2**20
    return out


def file_read_mb_s(directory: str, size: int = 256 << 20) -> float:
    path = os.path.join(directory, "bandwidth.bin")
    with open(path, "wb") as f:
        f.write(os.urandom(size))
    start = time.perf_counter()
    with open(path, "rb") as f:
        while f.read(8 << 20):
            pass
    seconds = time.perf_counter() - start
    os.unlink(path)
    return size / seconds / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--prompt-words", type=int, default=500, help="system prompt words")
    ap.add_argument("--new-tokens", type=int, default=12)
    ap.add_argument("--pool-tokens", type=int, default=1024, help="KV pool size (tokens)")
    ap.add_argument("--restart-words", type=int, default=3800)
    args = ap.parse_args()
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="radixlm-bench-") as tmp:
        log(f"agents, memory tier only ({args.sessions} sessions x {args.turns} turns)")
        results["memory"] = agents(args, None)
        log(f"  TTFT p50 {results['memory']['ttft_p50_s']:.2f} s")
        log("agents, memory + disk")
        results["memory_disk"] = agents(args, os.path.join(tmp, "agents"))
        log(f"  TTFT p50 {results['memory_disk']['ttft_p50_s']:.2f} s")
        log("restart: a ~4k-token prompt, cold vs from disk")
        results["restart"] = restart(args, os.path.join(tmp, "restart"))
        results["restart"]["file_read_mb_s"] = file_read_mb_s(tmp)
    mem, disk, rs = results["memory"], results["memory_disk"], results["restart"]
    same = mem.pop("texts") == disk.pop("texts")
    ratios = {
        "ttft_p50_memory_over_disk": mem["ttft_p50_s"] / disk["ttft_p50_s"],
        "req_s_disk_over_memory": disk["req_s"] / mem["req_s"],
        "restart_ttft_cold_over_disk": rs["cold_ttft_s"] / rs["disk_ttft_s"],
        "load_over_file_read_bandwidth": rs["load_mb_s"] / rs["file_read_mb_s"],
    }
    save("bench_cache_tiers", {"args": vars(args), "results": results, "ratios": ratios,
                               "same_agent_outputs": same})  # fmt: skip
    bar_chart("bench_cache_tiers",
              ["memory TTFT p50", "radixlm memory+disk TTFT p50", "restart cold TTFT",
               "radixlm restart disk TTFT"],
              [mem["ttft_p50_s"], disk["ttft_p50_s"], rs["cold_ttft_s"], rs["disk_ttft_s"]],
              "seconds", "KV disk tier: agent turns and a restart, CPU")  # fmt: skip
    print(
        f"bench_cache_tiers: agents TTFT p50 {disk['ttft_p50_s']:.2f} s with disk vs "
        f"{mem['ttft_p50_s']:.2f} s memory only (x{ratios['ttft_p50_memory_over_disk']:.1f}), "
        f"req/s x{ratios['req_s_disk_over_memory']:.2f}, same outputs {same}; restart "
        f"{rs['prompt_tokens']}-token prompt TTFT {rs['disk_ttft_s']:.2f} s from disk vs "
        f"{rs['cold_ttft_s']:.2f} s cold (x{ratios['restart_ttft_cold_over_disk']:.1f}); load "
        f"{rs['load_mb_s']:.0f} MB/s vs file read {rs['file_read_mb_s']:.0f} MB/s"
    )


if __name__ == "__main__":
    main()
