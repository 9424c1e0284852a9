"""GPU Engine benchmark: radixlm.Engine end to end on one GPU.

1. A Llama-3-8B-shaped model (``llama3-8b/config.json`` beside this file, random bf16 weights,
   no tokenizer): decode throughput at batch 1 / 32 / 256 with CUDA graphs, batch 1 (and 32)
   without them, and the prefill time of one 4096-token prompt.
2. A SmolLM2-135M-shaped model (its config, random weights saved as safetensors): the torch
   backend, the triton backend and the triton backend with CUDA graphs give the same greedy
   tokens (float32, where the backends differ only in rounding).

Decode throughput comes from runs that differ only in ``max_new_tokens`` (fresh random prompts
of equal length, cache flushed; the faster of two each): the difference is pure decode steps.

Usage: ``python benchmarks/gpu/bench_engine.py --out DIR [--smoke]``. Writes
``DIR/gpu_engine.json`` and ``DIR/gpu_engine.png`` and prints one summary line. ``--smoke`` runs
tiny shapes on CPU (Triton's interpreter) to check the script. Needs pyzmq and msgspec beside
torch / triton / transformers: ``benchmarks/gpu/fetch_wheels.sh`` fetches them to carry.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
LLAMA3_8B = HERE / "llama3-8b"
SMOLLM2_SHAPE = dict(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
    num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
    rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True,
)  # fmt: skip
TINY_SHAPE = dict(
    vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
    rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
)  # fmt: skip


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def write_config(path: Path, shape: dict) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "head_dim": None,
              "bos_token_id": 1, "eos_token_id": 2, **shape}  # fmt: skip
    config["head_dim"] = shape["hidden_size"] // shape["num_attention_heads"]
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return path


def write_random_model(path: Path, shape: dict) -> Path:
    """A Llama of ``shape`` with peaked random weights (like the tests' tiny models), so greedy
    tokens are not decided by rounding noise."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    write_config(path, shape)
    config = AutoConfig.from_pretrained(path)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5 if p.dim() == 1 else 0.08)
    model.save_pretrained(path, safe_serialization=True)
    return path


class Bench:
    """Runs the parts, writing the JSON after every engine so a timeout loses only the last."""

    def __init__(self, smoke: bool, out: Path, result: dict) -> None:
        self.smoke = smoke
        self.rng = random.Random(0)
        self.out, self.result = out, result

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "gpu_engine.json").write_text(json.dumps(self.result, indent=2))

    def engine(self, model_dir: Path, **options):
        from radixlm.runtime.engine import Engine

        base = dict(skip_tokenizer_init=True, chunked_prefill_size=8192, max_prefill_tokens=16384,
                    log_level="warning")  # fmt: skip
        if self.smoke:
            base.update(device="cpu", max_total_tokens=4096)
        return Engine(str(model_dir), **{**base, **options})

    def prompts(self, n: int, length: int, vocab: int) -> list[list[int]]:
        return [[self.rng.randrange(10, vocab) for _ in range(length)] for _ in range(n)]

    def timed(self, eng, prompts: list[list[int]], new_tokens: int) -> float:
        eng.flush_cache()
        params = {"max_new_tokens": new_tokens, "ignore_eos": True, "temperature": 0.0}
        start = time.perf_counter()
        outs = eng.generate(input_ids=prompts, sampling_params=params)
        seconds = time.perf_counter() - start
        assert all(len(o["output_ids"]) == new_tokens for o in outs), "short output"
        return seconds

    def decode(self, eng, batch: int, prompt_len: int, steps: int, vocab: int) -> dict:
        short = 4

        def best(new_tokens: int) -> float:
            return min(self.timed(eng, self.prompts(batch, prompt_len, vocab), new_tokens)
                       for _ in range(2))  # fmt: skip

        t_short, t_long = best(short), best(short + steps)
        row = {"batch": batch, "prompt_len": prompt_len, "steps": steps}
        per_step = (t_long - t_short) / steps
        if per_step <= 0:  # NOTE: only at smoke sizes, where noise exceeds the decode time
            return {**row, "ms_per_step": None, "tok_s": None}
        return {**row, "ms_per_step": round(per_step * 1e3, 3), "tok_s": round(batch / per_step, 1)}

    def prefill(self, eng, length: int, vocab: int, reps: int = 3) -> dict:
        times = [self.timed(eng, self.prompts(1, length, vocab), 1) for _ in range(reps)]
        ms = statistics.median(times) * 1e3
        return {"prompt_len": length, "ms": round(ms, 2), "tok_s": round(length / ms * 1e3, 1)}

    def llama3_8b(self, tmp: Path) -> None:
        model_dir = write_config(tmp / "tiny", TINY_SHAPE) if self.smoke else LLAMA3_8B
        vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
        batches = [1, 4] if self.smoke else [1, 32, 256]
        steps = {1: 128, 32: 128, 256: 64} if not self.smoke else {1: 8, 4: 8}
        prompt_len, prefill_len = (16, 256) if self.smoke else (128, 4096)
        result = self.result["llama3_8b"] = {
            "model": "tiny dummy" if self.smoke else "llama3-8b-shaped dummy", "dtype": "bfloat16",
        }  # fmt: skip
        for graphs in (True, False):
            name = "cuda_graphs" if graphs else "no_cuda_graphs"
            start = time.perf_counter()
            try:
                with self.engine(model_dir, load_format="dummy", dtype="bfloat16",
                                 disable_cuda_graph=not graphs) as eng:  # fmt: skip
                    result[f"{name}_start_s"] = round(time.perf_counter() - start, 1)
                    self.timed(eng, self.prompts(2, prompt_len, vocab), 4)  # warm-up (JIT)
                    rows = result[f"decode_{name}"] = []
                    for b in batches if graphs else batches[:2]:
                        rows.append(self.decode(eng, b, prompt_len, steps[b], vocab))
                        log(f"8b {name} decode batch {b}: {rows[-1]}")
                        self.save()
                    if graphs:
                        result["prefill"] = self.prefill(eng, prefill_len, vocab)
                        log(f"8b prefill: {result['prefill']}")
            except Exception as exc:  # noqa: BLE001 - keep the other engine's numbers
                result[f"{name}_error"] = f"{type(exc).__name__}: {exc}"
                log(f"8b {name} failed: {result[f'{name}_error']}")
            self.save()
        on = result.get("decode_cuda_graphs", [{}])[0].get("ms_per_step")
        off = result.get("decode_no_cuda_graphs", [{}])[0].get("ms_per_step")
        if on and off:
            result["graph_speedup_batch1"] = round(off / on, 2)

    def backend_agreement(self, tmp: Path) -> None:
        shape = TINY_SHAPE if self.smoke else SMOLLM2_SHAPE
        model_dir = write_random_model(tmp / "smol", shape)
        prompts = [self.prompts(1, n, shape["vocab_size"])[0]
                   for n in (5, 17, 33, 64, 1, 120, 9, 250)]  # fmt: skip
        new = 8 if self.smoke else 32
        # NOTE: staggered lengths: the batch shrinks 8 -> 1, so decode runs padded graph buckets.
        params = [{"max_new_tokens": max(2, new - 3 * i), "ignore_eos": True, "temperature": 0.0}
                  for i in range(len(prompts))]  # fmt: skip
        variants = {"torch": dict(attention_backend="torch"),
                    "triton": dict(attention_backend="triton", disable_cuda_graph=True),
                    "triton+graphs": dict(attention_backend="triton")}  # fmt: skip
        result = self.result["backends"] = {
            "model": "smollm2-135m-shaped random", "dtype": "float32", "prompts": len(prompts),
        }  # fmt: skip
        outs = {}
        for name, options in variants.items():
            try:
                with self.engine(model_dir, dtype="float32", max_running_requests=16,
                                 cuda_graph_max_bs=16, **options) as eng:  # fmt: skip
                    got = eng.generate(input_ids=prompts, sampling_params=params)
                    outs[name] = [o["output_ids"] for o in got]
            except Exception as exc:  # noqa: BLE001 - report, compare the others
                result[f"{name}_error"] = f"{type(exc).__name__}: {exc}"
                log(f"backend {name} failed: {result[f'{name}_error']}")
        ref = outs.get("torch")
        result["vs_torch"] = {
            name: {"identical": ids == ref, "token_match": round(_match(ids, ref), 4)}
            for name, ids in outs.items() if name != "torch" and ref is not None
        }  # fmt: skip
        log(f"backends float32 vs torch: {result['vs_torch']}")
        self.save()


def _match(a: list[list[int]], b: list[list[int]]) -> float:
    """Fraction of tokens equal up to each sequence's first divergence."""
    same = total = 0
    for x, y in zip(a, b):
        total += len(y)
        for s, t in zip(x, y):
            if s != t:
                break
            same += 1
    return same / max(total, 1)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    llama = result.get("llama3_8b", {})
    on = {r["batch"]: r["tok_s"] or 0 for r in llama.get("decode_cuda_graphs", [])}
    off = {r["batch"]: r["tok_s"] or 0 for r in llama.get("decode_no_cuda_graphs", [])}
    if not on:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    batches = sorted(on)
    x = range(len(batches))
    ax.bar([i - 0.2 for i in x], [on[b] for b in batches], 0.4, label="CUDA graphs")
    ax.bar([i + 0.2 for i in x], [off.get(b, 0) for b in batches], 0.4, label="eager")
    ax.set_xticks(list(x), [f"batch {b}" for b in batches])
    ax.set_yscale("log")
    ax.set_ylabel("decode tokens/s")
    ax.set_title("radixlm Engine, Llama-3-8B-shaped bf16")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary(result: dict) -> str:
    llama = result.get("llama3_8b", {})
    rates = {r["batch"]: r["tok_s"] for r in llama.get("decode_cuda_graphs", [])}
    agree = result.get("backends", {}).get("vs_torch", {})
    same = all(v.get("identical") for v in agree.values()) if agree else False
    return (f"gpu_engine: decode tok/s {rates} graph_speedup_b1="
            f"{llama.get('graph_speedup_batch1', float('nan'))} "
            f"prefill_4k_ms={llama.get('prefill', {}).get('ms', float('nan'))} "
            f"backends_fp32_identical={same}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmarks/gpu/out"))
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on CPU")
    args = parser.parse_args()
    import torch

    if args.smoke and not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # the engine's processes inherit it
    elif not torch.cuda.is_available():
        sys.exit("bench_engine: no CUDA device (use --smoke on CPU)")
    result: dict = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                    "torch": torch.__version__, "smoke": args.smoke}  # fmt: skip
    out = Path(args.out)
    bench = Bench(args.smoke, out, result)
    with tempfile.TemporaryDirectory() as tmp:
        for key, fn in (("llama3_8b", bench.llama3_8b), ("backends", bench.backend_agreement)):
            start = time.perf_counter()
            try:
                fn(Path(tmp))
            except Exception as exc:  # noqa: BLE001 - one failing part must not lose the other
                result.setdefault(key, {})["error"] = f"{type(exc).__name__}: {exc}"
                log(f"{key} failed: {result[key]['error']}")
            log(f"{key} done in {time.perf_counter() - start:.1f} s")
            bench.save()
    plot(result, out / "gpu_engine.png")
    print(summary(result))


if __name__ == "__main__":
    main()
