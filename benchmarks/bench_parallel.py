"""Parallelism: data-parallel routing (cache-aware vs round-robin) and tensor-parallel latency.

1. dp=N on a multi-prefix workload: G few-shot headers, R questions each, in shuffled order,
   sent in waves; each policy's KV-cache hit rate (from the replicas' own counters) and
   throughput.
2. tp=1 vs tp=N: latency of one request (prefill only, and with decode steps); on a machine with
   several GPUs the same run measures NCCL scaling, on CPU gloo's overhead. SmolLM2's 9 heads
   do not split over 2 ranks, so this part uses random weights of SmolLM2's size with 8 heads
   and 4 KV heads (``--tp-model`` to use a real one).

Run: ``.venv/bin/python benchmarks/bench_parallel.py [--groups 8 --per-group 4 --tp-sizes 1 2]``
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import log, save  # noqa: E402
from prefix_workload import few_shot_prefix, questions  # noqa: E402

NEW_TOKENS = 8


def workload(groups: int, per_group: int, shots: int, seed: int = 0) -> list[str]:
    """``groups`` few-shot headers x ``per_group`` questions, shuffled."""
    asks = questions(groups * per_group)
    batch = [few_shot_prefix(shots, seed=100 + g) + asks[g * per_group + i]
             for g in range(groups) for i in range(per_group)]
    random.Random(seed).shuffle(batch)
    return batch


def run_dp(batch: list[str], policy: str, dp: int, wave: int, options: dict) -> dict:
    from radixlm import Engine

    with Engine(dp_size=dp, load_balance_method=policy, **options) as engine:
        engine.generate("warm up", {"max_new_tokens": 2})
        engine.flush_cache()
        start = time.perf_counter()
        outs = []
        for i in range(0, len(batch), wave):
            outs += engine.generate(batch[i : i + wave], {"max_new_tokens": NEW_TOKENS,
                                                          "temperature": 0})
        elapsed = time.perf_counter() - start
        stats = engine.get_server_info()["stats"]
    replicas = [{k: r[k] for k in ("cache_hit_rate", "hit_tokens", "queried_tokens")}
                | r["router"] for r in stats["replicas"]]
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    return {"seconds": elapsed, "req_s": len(batch) / elapsed, "gen_tok_s": tokens / elapsed,
            "hit_rate": stats["cache_hit_rate"], "replicas": replicas,
            "decisions": stats["router"]["decisions"]}


def smollm_sized_dummy(path: str) -> str:
    """A random-weight Llama of SmolLM2-135M's size whose heads split over 2, 4 or 8 ranks."""
    from radixlm.runtime.loader.gguf_loader import gguf_tokenizer
    from radixlm.runtime.loader.model_files import default_model_path

    os.makedirs(path, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
        "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 8,
        "num_key_value_heads": 4, "vocab_size": 49152, "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "tie_word_embeddings": True,
        "eos_token_id": 2, "bos_token_id": 1,
    }
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    gguf_tokenizer(default_model_path()).save_pretrained(path)
    return path


def run_tp(tp: int, prompt: str, repeats: int, options: dict) -> dict:
    from radixlm import Engine

    def latency(engine, new_tokens: int) -> float:
        times = []
        for _ in range(repeats):
            engine.flush_cache()
            start = time.perf_counter()
            engine.generate(prompt, {"max_new_tokens": new_tokens, "temperature": 0,
                                     "ignore_eos": True})
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    with Engine(tp_size=tp, **options) as engine:
        engine.generate("warm up", {"max_new_tokens": 2})
        prefill = latency(engine, 1)
        full = latency(engine, 1 + 4 * NEW_TOKENS)
    return {"prefill_s": prefill, "e2e_s": full,
            "decode_ms_per_token": 1000 * (full - prefill) / (4 * NEW_TOKENS)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default=None, help="model path (default: the embedded SmolLM2)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--dp", type=int, default=2)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--per-group", type=int, default=4)
    ap.add_argument("--shots", type=int, default=8)
    ap.add_argument("--wave", type=int, default=8, help="requests sent together")
    ap.add_argument("--tp-sizes", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--tp-model", default=None, help="default: SmolLM2-sized random weights")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-dp", action="store_true")
    ap.add_argument("--skip-tp", action="store_true")
    args = ap.parse_args()
    options = {"model_path": args.model, "dtype": args.dtype, "max_total_tokens": 16384}
    dp: dict[str, dict] = {}
    if not args.skip_dp:
        batch = workload(args.groups, args.per_group, args.shots)
        for policy in ("cache_aware", "round_robin"):
            log(f"dp={args.dp} {policy}: {len(batch)} requests")
            dp[policy] = run_dp(batch, policy, args.dp, args.wave, options)
            log(f"  hit rate {dp[policy]['hit_rate']:.1%}, {dp[policy]['req_s']:.2f} req/s")
    tp: dict[str, dict] = {}
    if not args.skip_tp:
        prompt = few_shot_prefix(args.shots) + questions(1)[0]
        tmp = tempfile.mkdtemp(prefix="bench-parallel-")
        model = args.tp_model or smollm_sized_dummy(tmp)
        tp_options = {**options, "model_path": model}
        if not args.tp_model:
            tp_options["load_format"] = "dummy"
        try:
            for size in args.tp_sizes:
                log(f"tp={size}")
                tp[str(size)] = run_tp(size, prompt, args.repeats, tp_options)
                log(f"  prefill {tp[str(size)]['prefill_s'] * 1000:.0f} ms, "
                    f"decode {tp[str(size)]['decode_ms_per_token']:.1f} ms/token")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    save("bench_parallel", {"args": vars(args), "dp": dp, "tp": tp})
    print("bench_parallel: " + ", ".join(summary(dp, tp)))


def summary(dp: dict, tp: dict) -> list[str]:
    parts = []
    if dp:
        ca, rr = dp["cache_aware"], dp["round_robin"]
        parts.append(f"dp hit rate cache_aware {ca['hit_rate']:.1%} vs round_robin "
                     f"{rr['hit_rate']:.1%} (x{ca['hit_rate'] / max(rr['hit_rate'], 1e-9):.2f})")
        parts.append(f"throughput {ca['req_s']:.2f} vs {rr['req_s']:.2f} req/s")
    parts += [f"tp={k} decode {v['decode_ms_per_token']:.1f} ms/token, prefill "
              f"{v['prefill_s'] * 1000:.0f} ms" for k, v in tp.items()]
    return parts


if __name__ == "__main__":
    main()
