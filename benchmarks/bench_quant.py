"""GGUF files as people download them: Q4_K_M, Q5_K_M, Q6_K and Q8_0 of the embedded SmolLM2,
made with llama.cpp's own quantizer (``llama_cpp.llama_model_quantize``) from an F16 file
written from the embedded one (its Q4_1 weights decoded), so both engines read the same bytes.

For each file: radixlm's ``Engine`` (the weights kept in their blocks, ``quantization`` auto;
such models run their steps eagerly) against llama.cpp (llama-cpp-python, every core):
single-stream decode tok/s (best of 3) and batch-32 aggregate tok/s (llama.cpp decoding the
32 sequences in one context, as its server's parallel slots do), plus radixlm's weight bytes
against the file's size. radixlm's first request after a fresh start (what a user meets) is
reported too.

SmolLM2's hidden size (576) is not a multiple of 256, so llama.cpp's quantizer stores most of
its K-quant tensors in the fallback type (Q5_0/Q5_1/Q8_0); the types per file are in the
results. Run: ``.venv/bin/python benchmarks/bench_quant.py [--types Q4_K_M,Q8_0] [--eager]``
(needs the bench extra's llama-cpp-python; ``--eager``: radixlm's steps uncompiled, no
minutes of building graphs per file).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_offline import PROMPT, batch_prompts, llamacpp_parallel  # noqa: E402
from common import bar_chart, log, save, wait_compiled  # noqa: E402

# llama.cpp's file types (llama.h's LLAMA_FTYPE_MOSTLY_*)
FTYPES = {"Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18, "Q8_0": 7}
RUNS = 3


def f16_source(out: str) -> str:
    """The embedded model with every tensor decoded, written as F16 (norms F32)."""
    import gguf
    import numpy as np

    from radixlm.runtime.loader.gguf_loader import dequantize
    from radixlm.runtime.loader.model_files import default_model_path

    if os.path.exists(out):
        return out
    reader = gguf.GGUFReader(default_model_path())
    writer = gguf.GGUFWriter(out + ".tmp", "llama")
    for field in reader.fields.values():
        if not field.name.startswith("GGUF.") and field.name not in (
            "general.architecture", "general.file_type"):  # fmt: skip
            sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, field.contents(), field.types[0], sub)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for t in reader.tensors:
        shape = [int(d) for d in reversed(t.shape)]
        array = dequantize(t).reshape(shape).numpy()
        writer.add_tensor(t.name, array.astype(np.float16 if len(shape) == 2 else np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(out + ".tmp", out)
    return out


def quantize(source: str, kind: str, out: str) -> str:
    import llama_cpp as lc

    if not os.path.exists(out):
        params = lc.llama_model_quantize_default_params()
        params.ftype = FTYPES[kind]
        params.nthread = os.cpu_count()
        if lc.llama_model_quantize(source.encode(), out.encode(), params) != 0:
            raise RuntimeError(f"llama.cpp could not quantize {source} to {kind}")
    return out


def tensor_types(path: str) -> dict[str, int]:
    from radixlm.runtime.loader.gguf_loader import open_gguf

    return dict(Counter(t.tensor_type.name for t in open_gguf(path).tensors))


def radixlm_runs(path: str, batch: int, new_tokens: int, compiled: bool) -> dict:
    """The first request after a fresh start, then (``compiled``: once the compiled CPU steps
    are built, minutes the first time for each file) the warm rows."""
    from radixlm import Engine

    p = {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
    start = time.perf_counter()
    with Engine(model_path=path, max_total_tokens=16384,
                disable_cpu_compile=not compiled) as engine:  # fmt: skip
        ready = time.perf_counter() - start
        begin = time.perf_counter()
        first = engine.generate(PROMPT, p)["meta_info"]["completion_tokens"]
        out = {"ready_s": round(ready, 2),
               "first_request_tok_s": first / (time.perf_counter() - begin)}  # fmt: skip
        out["steps"] = wait_compiled(engine) if compiled else "eager"

        def single() -> float:
            engine.flush_cache()
            begin = time.perf_counter()
            made = engine.generate(PROMPT, p)["meta_info"]["completion_tokens"]
            return made / (time.perf_counter() - begin)

        out["single_tok_s"] = max(single() for _ in range(RUNS))
        engine.flush_cache()
        begin = time.perf_counter()
        outs = engine.generate(batch_prompts(batch, 0), p)
        total = sum(o["meta_info"]["completion_tokens"] for o in outs)
        out[f"batch{batch}_tok_s"] = total / (time.perf_counter() - begin)
        info = engine.get_server_info()
        out["weight_bytes"] = info["memory_bytes"]["weights"]
        out["weight_bytes_by_type"] = info["weight_bytes_by_type"]
    return out


def llamacpp_runs(path: str, batch: int, new_tokens: int, threads: int) -> dict:
    from llama_cpp import Llama

    llm = Llama(model_path=path, n_ctx=1024, n_threads=threads, verbose=False)
    p = {"max_tokens": new_tokens, "temperature": 0.0, "logit_bias": {llm.token_eos(): -1e9}}

    def single(run: int) -> float:
        begin = time.perf_counter()
        made = llm(PROMPT + " " * run, **p)["usage"]["completion_tokens"]
        return made / (time.perf_counter() - begin)

    single(0)
    out = {"single_tok_s": max(single(run) for run in range(1, RUNS + 1))}
    begin = time.perf_counter()
    total = sum(map(len, llamacpp_parallel(llm, batch_prompts(batch, 0), new_tokens, threads)))
    out[f"batch{batch}_tok_s"] = total / (time.perf_counter() - begin)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--types", default=",".join(FTYPES))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--dir", default=os.path.expanduser("~/.cache/radixlm/bench_quant"))
    ap.add_argument("--eager", action="store_true",
                    help="radixlm without compiled CPU steps (they take minutes per file)")
    args = ap.parse_args()
    threads = os.cpu_count()
    os.makedirs(args.dir, exist_ok=True)
    source = f16_source(os.path.join(args.dir, "smollm2-135m-f16.gguf"))
    results, ratios = {}, {}
    for kind in args.types.split(","):
        path = quantize(source, kind, os.path.join(args.dir, f"smollm2-135m-{kind}.gguf"))
        size = os.path.getsize(path)
        log(f"{kind}: {size / 2**20:.1f} MiB, {tensor_types(path)}")
        ours = radixlm_runs(path, args.batch, args.new_tokens, not args.eager)
        log(f"  radixlm: {ours}")
        peer = llamacpp_runs(path, args.batch, args.new_tokens, threads)
        log(f"  llama.cpp ({threads} threads): {peer}")
        results[kind] = {"file_bytes": size, "tensor_types": tensor_types(path),
                         "radixlm": ours, "llama_cpp": peer}  # fmt: skip
        key = f"batch{args.batch}_tok_s"
        ratios[kind] = {
            "single_vs_llama_cpp": round(ours["single_tok_s"] / peer["single_tok_s"], 2),
            "first_request_vs_llama_cpp": round(
                ours["first_request_tok_s"] / peer["single_tok_s"], 2),
            f"batch{args.batch}_vs_llama_cpp": round(ours[key] / peer[key], 2),
            "weights_vs_file": round(ours["weight_bytes"] / size, 2),
        }  # fmt: skip
        log(f"  ratios: {ratios[kind]}")
    name = "bench_quant_eager" if args.eager else "bench_quant"
    path = save(name, {"threads_llama_cpp": threads, "new_tokens": args.new_tokens,
                       "batch": args.batch, "eager": args.eager, "results": results,
                       "ratios": ratios})  # fmt: skip
    labels, values = [], []
    for kind, r in ratios.items():
        labels += [f"radixlm {kind} single", f"radixlm {kind} batch{args.batch}"]
        values += [r["single_vs_llama_cpp"], r[f"batch{args.batch}_vs_llama_cpp"]]
    bar_chart(name, labels, values, "x llama.cpp (same file)",
              "GGUF quantized files: radixlm / llama.cpp tok/s")  # fmt: skip
    print(f"saved {path}")


if __name__ == "__main__":
    main()
