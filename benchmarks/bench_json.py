"""Schema-constrained extraction: jump-forward on vs off, outlines vs llguidance vs xgrammar.

In-process scheduler on the embedded SmolLM2 (the engine core, without the process hops, so the
grammar's share of a step is measured exactly): throughput and validity per configuration,
compile time p50/p99 per backend, and mask time per decode step: the time spent filling masks
(on a thread, during the forward) and the time sampling waited for them.
Run: ``.venv/bin/python benchmarks/bench_json.py [--prompts 16]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jsonschema  # noqa: E402
from common import bar_chart, log, save  # noqa: E402

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 24},
        "occupation": {"enum": ["engineer", "teacher", "doctor", "artist", "other"]},
        "skills": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 3},
    },
    "required": ["name", "age", "city", "occupation", "skills"],
    "additionalProperties": False,
}
PEOPLE = [
    ("Alice", 34, "Paris", "engineer"), ("Bob", 51, "Berlin", "teacher"),
    ("Chen", 28, "Shanghai", "doctor"), ("Dana", 45, "Toronto", "artist"),
    ("Emil", 39, "Oslo", "engineer"), ("Fatima", 31, "Cairo", "doctor"),
    ("Goro", 62, "Osaka", "teacher"), ("Hana", 23, "Seoul", "artist"),
]  # fmt: skip
COMPILE_SCHEMAS = [
    PERSON,
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
    {"type": "object", "properties": {"id": {"type": "string", "format": "uuid"},
     "when": {"type": "string", "format": "date"}}, "required": ["id", "when"]},
    {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "object",
     "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                    "qty": {"type": "integer", "minimum": 1, "maximum": 99}},
     "required": ["sku", "qty"]}, "minItems": 1, "maxItems": 5}}, "required": ["items"]},
    {"type": "object", "properties": {"email": {"type": "string", "format": "email"},
     "score": {"type": "number", "minimum": 0, "maximum": 1}}, "required": ["email", "score"]},
    {"anyOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
               {"type": "object", "properties": {"b": {"type": "string"}}, "required": ["b"]}]},
]  # fmt: skip


def prompts(tok, n: int) -> list[list[int]]:
    out = []
    for i in range(n):
        name, age, city, job = PEOPLE[i % len(PEOPLE)]
        text = f"{name} is a {age}-year-old {job} living in {city}. Extract a JSON record."
        chat = [{"role": "user", "content": text}]
        out.append(
            tok.encode(tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True))
        )
    return out


def run_config(backend: str, jump_forward: bool, n: int) -> dict:
    from radixlm.runtime.config import ServerArgs
    from radixlm.runtime.messages import GenerateReq
    from radixlm.runtime.sampling.params import parse_sampling
    from radixlm.runtime.scheduler.scheduler import Scheduler

    # NOTE: eager steps: this process builds six schedulers, and compiled graphs (keyed by the
    # model's forward) stop being made past dynamo's recompile limit
    s = Scheduler(
        ServerArgs(
            max_total_tokens=16384, grammar_backend=backend,
            disable_jump_forward=not jump_forward, disable_cpu_compile=True,
        )
    )  # fmt: skip
    tok = s.runner.tokenizer
    times = {"forward": 0.0, "mask": 0.0, "steps": 0}
    _instrument(s, times)
    schema = json.dumps(PERSON)
    warm = parse_sampling({"max_new_tokens": 4, "json_schema": schema})
    s.handle(GenerateReq("warm", tok.encode("{"), warm))
    _drain(s, {})
    times.update(forward=0.0, mask=0.0, steps=0)
    wait_before = s.stats.mask_wait_s
    outs: dict[str, list[int]] = {}
    start = time.perf_counter()
    for i, ids in enumerate(prompts(tok, n)):
        s.handle(
            GenerateReq(
                f"p{i}",
                ids,
                parse_sampling({"max_new_tokens": 160, "temperature": 0, "json_schema": schema}),
            )
        )
    _drain(s, outs)
    elapsed = time.perf_counter() - start
    wait = s.stats.mask_wait_s - wait_before
    valid = sum(_valid(tok.decode(v, skip_special_tokens=True)) for v in outs.values())
    tokens = sum(len(v) for v in outs.values())
    return {
        "seconds": elapsed,
        "req_s": n / elapsed,
        "output_tokens": tokens,
        "forward_passes": times["steps"],
        "validity": valid / n,
        "mask_fill_ms_per_step": 1000 * times["mask"] / max(times["steps"], 1),
        "mask_wait_ms_per_step": 1000 * wait / max(times["steps"], 1),
        "mask_share_of_step": wait / max(times["forward"] + wait, 1e-9),
    }


def _instrument(s, times: dict) -> None:
    forward, bitmask = s.runner.forward, s.grammars.bitmask

    def timed_forward(batch):
        t = time.perf_counter()
        out = forward(batch)
        times["forward"] += time.perf_counter() - t
        times["steps"] += 1
        return out

    def timed_mask(reqs, vocab):
        t = time.perf_counter()
        out = bitmask(reqs, vocab)
        times["mask"] += time.perf_counter() - t
        return out

    s.runner.forward, s.grammars.bitmask = timed_forward, timed_mask


def _drain(s, outs: dict) -> None:
    while s.has_work or s.outbox:
        for o in s.step():
            outs.setdefault(o.rid, []).extend(o.new_ids)


def _valid(text: str) -> bool:
    try:
        jsonschema.validate(json.loads(text), PERSON)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def compile_times(backend: str, repeats: int) -> dict:
    from radixlm.runtime.constrained.base import create_grammar_backend
    from radixlm.runtime.loader.gguf_loader import gguf_tokenizer
    from radixlm.runtime.loader.model_files import default_model_path

    tok = gguf_tokenizer(default_model_path())
    times = []
    for _ in range(repeats):
        b = create_grammar_backend(backend, tok, 49152, [2])  # fresh: no cached grammars
        for schema in COMPILE_SCHEMAS:
            t = time.perf_counter()
            b.compile("json_schema", json.dumps(schema))
            times.append(time.perf_counter() - t)
    times.sort()
    return {
        "p50_ms": 1000 * statistics.median(times),
        "p99_ms": 1000 * times[min(len(times) - 1, int(0.99 * len(times)))],
        "n": len(times),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--compile-repeats", type=int, default=3)
    args = ap.parse_args()
    results, compiles = {}, {}
    for backend in ("outlines", "llguidance", "xgrammar"):
        log(f"compile times, {backend}")
        compiles[backend] = compile_times(backend, args.compile_repeats)
        for jf in (True, False):
            name = f"{backend}_jump_forward_{'on' if jf else 'off'}"
            log(name)
            results[name] = run_config(backend, jf, args.prompts)
            log(f"  {results[name]['req_s']:.2f} req/s, validity {results[name]['validity']:.0%}")
    ratios = {
        f"jump_forward_{b}": results[f"{b}_jump_forward_on"]["req_s"]
        / results[f"{b}_jump_forward_off"]["req_s"]
        for b in compiles
    }
    for b in ("llguidance", "xgrammar"):
        ratios[f"{b}_vs_outlines"] = (
            results[f"{b}_jump_forward_on"]["req_s"] / results["outlines_jump_forward_on"]["req_s"]
        )
    save(
        "bench_json",
        {"args": vars(args), "results": results, "compile": compiles, "ratios": ratios},
    )
    bar_chart(
        "bench_json",
        [f"radixlm {k}" for k in results],
        [r["req_s"] for r in results.values()],
        "requests / s",
        "JSON-schema extraction, SmolLM2-135M, CPU",
    )
    worst_mask = max(r["mask_share_of_step"] for r in results.values())
    print(
        "bench_json: "
        + ", ".join(f"{k} x{v:.2f}" for k, v in ratios.items())
        + f", validity {min(r['validity'] for r in results.values()):.0%}"
        + f", mask <= {worst_mask:.2%} of a step, compile p50 "
        + ", ".join(f"{b} {c['p50_ms']:.0f} ms" for b, c in compiles.items())
    )


if __name__ == "__main__":
    main()
