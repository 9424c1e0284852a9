"""Multi-LoRA serving: 8 adapters, 32 concurrent requests spread over them, against the same
load on the base model alone, in one engine (the embedded SmolLM2, float32 on CPU).

The adapters are random rank-16 peft adapters on every projection (q/k/v/o, gate/up/down),
written as peft saves them. Each phase sends the 32 requests at once (one ``generate`` batch)
and reports output tokens/s and mean time to first token; the first phase runs right after a
fresh start (base model), then mixed, then both again warm. The mixed phase runs its forwards
eagerly (compiled CPU steps know the base model only).
Run: ``.venv/bin/python benchmarks/bench_lora.py [--requests 32] [--new 64]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from common import bar_chart, log, save  # noqa: E402

ADAPTERS, RANK = 8, 16
MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def write_adapter(path: str, config, seed: int) -> None:
    """A peft-format adapter (random A and B) for a model of ``config``'s shape."""
    from safetensors.torch import save_file

    c, g = config, torch.Generator().manual_seed(seed)
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    dims = {"q_proj": (c.hidden_size, q), "k_proj": (c.hidden_size, kv),
            "v_proj": (c.hidden_size, kv), "o_proj": (q, c.hidden_size),
            "gate_proj": (c.hidden_size, c.intermediate_size),
            "up_proj": (c.hidden_size, c.intermediate_size),
            "down_proj": (c.intermediate_size, c.hidden_size)}  # fmt: skip
    tensors = {}
    for layer in range(c.num_layers):
        for module in MODULES:
            part = "self_attn" if module in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            key = f"base_model.model.model.layers.{layer}.{part}.{module}"
            fan_in, fan_out = dims[module]
            tensors[f"{key}.lora_A.weight"] = torch.randn(RANK, fan_in, generator=g) * 0.02
            tensors[f"{key}.lora_B.weight"] = torch.randn(fan_out, RANK, generator=g) * 0.02
    os.makedirs(path, exist_ok=True)
    save_file(tensors, os.path.join(path, "adapter_model.safetensors"))
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": RANK, "lora_alpha": 2 * RANK,
                   "target_modules": list(MODULES), "bias": "none"}, f)  # fmt: skip


def phase(engine, prompts: list[list[int]], loras: list[str | None], new: int) -> dict:
    params = {"max_new_tokens": new, "temperature": 0, "ignore_eos": True}
    engine.flush_cache()
    start = time.perf_counter()
    outs = engine.generate(input_ids=prompts, lora_path=loras, sampling_params=params)
    wall = time.perf_counter() - start
    tokens = sum(len(o["output_ids"]) for o in outs)
    ttft = sum(o["meta_info"]["first_token_latency"] for o in outs) / len(outs)
    return {"wall_s": round(wall, 2), "tok_s": round(tokens / wall, 1), "ttft_s": round(ttft, 3)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--new", type=int, default=64)
    args = ap.parse_args()
    from radixlm import Engine
    from radixlm.runtime.config import ModelConfig
    from radixlm.runtime.loader.gguf_loader import gguf_config, open_gguf
    from radixlm.runtime.loader.model_files import default_model_path

    root = tempfile.mkdtemp(prefix="bench-lora-")
    config: ModelConfig = gguf_config(open_gguf(default_model_path()))
    paths = {}
    for i in range(ADAPTERS):
        paths[f"task{i}"] = os.path.join(root, f"task{i}")
        write_adapter(paths[f"task{i}"], config, seed=i)
    log(f"{ADAPTERS} adapters of rank {RANK} written under {root}")
    start = time.perf_counter()
    engine = Engine(dtype="float32", lora_paths=paths, max_loras=ADAPTERS, max_lora_rank=RANK)
    log(f"engine ready in {time.perf_counter() - start:.1f} s")
    prompts = [[1] + [100 + (7 * i + j) % 5000 for j in range(24 + i % 8)]
               for i in range(args.requests)]  # fmt: skip
    mixed = [f"task{i % ADAPTERS}" for i in range(args.requests)]
    base = [None] * args.requests
    result = {"requests": args.requests, "new_tokens": args.new, "adapters": ADAPTERS,
              "rank": RANK}  # fmt: skip
    for name, loras in (("first_base", base), ("first_mixed", mixed),
                        ("warm_base", base), ("warm_mixed", mixed)):  # fmt: skip
        result[name] = phase(engine, prompts, loras, args.new)
        log(f"{name}: {result[name]}")
    result["cpu_compile"] = engine.get_server_info()["stats"]["cpu_compile"]
    engine.shutdown()
    for when in ("first", "warm"):
        b, m = result[f"{when}_base"], result[f"{when}_mixed"]
        result[f"{when}_mixed_vs_base"] = round(m["tok_s"] / b["tok_s"], 3)
    save("bench_lora", result)
    bar_chart("bench_lora", ["base first", "radixlm 8 LoRA first", "base warm",
                             "radixlm 8 LoRA warm"],
              [result[k]["tok_s"] for k in ("first_base", "first_mixed", "warm_base",
                                            "warm_mixed")],
              "output tok/s", f"{args.requests} requests, {ADAPTERS} adapters")  # fmt: skip
    print(f"bench_lora: mixed {ADAPTERS}-adapter throughput {result['warm_mixed']['tok_s']} tok/s "
          f"= {result['warm_mixed_vs_base']:.2f}x base-only warm "
          f"({result['first_mixed_vs_base']:.2f}x in the first minute)")


if __name__ == "__main__":
    main()
