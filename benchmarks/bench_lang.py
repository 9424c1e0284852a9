"""HellaSwag-style ``select`` programs: a shared 20-shot prefix, then a context and 4 endings.

Compares the frontend language's ``run_batch`` on the in-process Engine with the radix cache on
and off, and (when the server is available) the same questions sent by a plain loop of
independent ``/generate`` requests, one per ending. Reports programs/s, cache hit rate and
accuracy. Run: ``.venv/bin/python benchmarks/bench_lang.py [--questions 8] [--no-http]``
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import bar_chart, log, save  # noqa: E402

import radixlm as sgl  # noqa: E402
from radixlm.lang import EngineBackend  # noqa: E402

ACTIVITIES = [
    ("is slicing bread on a wooden board", "puts the slices in a basket."),
    ("is tying the laces of running shoes", "jogs off down the street."),
    ("is filling a watering can at the tap", "waters the flowers in the garden."),
    ("is pouring batter into a hot pan", "flips the pancake with a spatula."),
    ("is tuning a guitar on the sofa", "starts playing a quiet song."),
    ("is rolling out dough for a pizza", "spreads tomato sauce over it."),
    ("is washing a car with a sponge", "rinses the soap off with a hose."),
    ("is climbing a ladder with a paint brush", "paints the top of the wall."),
    ("is putting on a helmet next to a bicycle", "rides the bike along the path."),
    ("is opening a book at the library desk", "reads the first page carefully."),
    ("is stretching on a yoga mat", "holds a pose and breathes slowly."),
    ("is loading clothes into a washing machine", "adds detergent and starts the wash."),
    ("is holding a fishing rod at the lake", "casts the line into the water."),
    ("is setting up a tent in the forest", "hammers the pegs into the ground."),
    ("is sharpening a pencil at a desk", "begins sketching a portrait."),
    ("is kneeling by a fireplace with logs", "lights the fire with a match."),
]
NAMES = ["A man", "A woman", "A boy", "A girl", "An old man", "A young woman", "A chef",
         "A teenager"]
N_SHOTS = 20


def make_items(n: int, seed: int) -> list[tuple[str, list[str], int]]:
    """``n`` (context, 4 endings, index of the right one) built from the activities."""
    rng = random.Random(seed)
    items = []
    for _ in range(n):
        k = rng.randrange(len(ACTIVITIES))
        activity, ending = ACTIVITIES[k]
        wrong = rng.sample([e for j, (_, e) in enumerate(ACTIVITIES) if j != k], 3)
        endings = [ending, *wrong]
        rng.shuffle(endings)
        context = f"{rng.choice(NAMES)} {activity}. Then they"
        items.append((context, [" " + e for e in endings], endings.index(ending)))
    return items


def few_shot_prefix(seed: int = 1234) -> str:
    shots = make_items(N_SHOTS, seed)
    lines = ["Pick the most sensible ending for each scene.\n\n"]
    lines += [f"Scene: {ctx}{endings[gold]}\n\n" for ctx, endings, gold in shots]
    return "".join(lines)


PREFIX = few_shot_prefix()


@sgl.function
def hellaswag(s, context, endings):
    s += PREFIX
    s += "Scene: " + context
    s += sgl.select("ending", choices=endings)


def _hit_rate(before: dict, after: dict) -> float:
    queried = after["queried_tokens"] - before["queried_tokens"]
    return (after["hit_tokens"] - before["hit_tokens"]) / max(queried, 1)


def run_lang(items: list, **engine_options) -> dict:
    """run_batch on an in-process Engine."""
    engine = sgl.Engine(max_total_tokens=65536, **engine_options)
    try:
        backend = EngineBackend(engine)
        hellaswag.run(context="warm up", endings=[" a", " b"], backend=backend)
        engine.flush_cache()
        before = engine.get_server_info()["stats"]
        start = time.perf_counter()
        states = hellaswag.run_batch(
            [{"context": c, "endings": e} for c, e, _ in items], backend=backend
        )
        elapsed = time.perf_counter() - start
        after = engine.get_server_info()["stats"]
    finally:
        engine.shutdown()
    errors = [repr(s.error()) for s in states if s.error() is not None]
    correct = sum(
        s["ending"] == e[gold] for s, (_, e, gold) in zip(states, items) if s.error() is None
    )
    return {"seconds": elapsed, "programs_s": len(items) / elapsed,
            "hit_rate": _hit_rate(before, after), "accuracy": correct / len(items),
            "errors": errors[:3]}


def run_http_loop(items: list) -> dict:
    """A plain client: one ``/generate`` per ending, sequentially, scoring the ending tokens."""
    import httpx

    with _Server() as url, httpx.Client(base_url=url, timeout=None) as client:
        before = client.get("/get_server_info").json()["stats"]
        start = time.perf_counter()
        correct = sum(_http_question(client, ctx, endings) == gold for ctx, endings, gold in items)
        elapsed = time.perf_counter() - start
        after = client.get("/get_server_info").json()["stats"]
    return {"seconds": elapsed, "programs_s": len(items) / elapsed,
            "hit_rate": _hit_rate(before, after), "accuracy": correct / len(items)}


def _http_question(client, context: str, endings: list[str]) -> int:
    prompt = PREFIX + "Scene: " + context
    start = len(client.post("/tokenize", json={"text": prompt}).json()["tokens"])
    scores = []
    for ending in endings:
        out = client.post("/generate", json={
            "text": prompt + ending, "sampling_params": {"max_new_tokens": 0},
            "return_logprob": True, "logprob_start_len": start,
        }).json()
        values = [e[0] for e in out["meta_info"]["input_token_logprobs"]]
        scores.append(sum(values) / len(values))
    return max(range(len(scores)), key=scores.__getitem__)


class _Server:
    """``python -m radixlm.server`` on a free port for the duration of a ``with`` block."""

    def __enter__(self) -> str:
        import httpx

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "radixlm.server", "--port", str(port),
             "--max-total-tokens", "65536", "--log-level", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        for _ in range(900):
            if self.proc.poll() is not None:
                raise RuntimeError("the server exited during startup")
            try:
                if httpx.get(url + "/health_generate", timeout=30).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise TimeoutError("the server did not start")

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-http", action="store_true", help="skip the HTTP plain loop")
    args = parser.parse_args()
    items = make_items(args.questions, args.seed)
    runs: dict[str, dict] = {}
    log(f"{args.questions} questions, 20-shot prefix of {len(PREFIX)} characters")
    runs["radixlm run_batch"] = run_lang(items)
    log(f"radix on: {runs['radixlm run_batch']}")
    runs["radixlm run_batch, no radix cache"] = run_lang(items, disable_radix_cache=True)
    log(f"radix off: {runs['radixlm run_batch, no radix cache']}")
    if not args.no_http and importlib.util.find_spec("radixlm.server.__main__") is not None:
        runs["HTTP requests, plain loop"] = run_http_loop(items)
        log(f"http loop: {runs['HTTP requests, plain loop']}")
    path = save("bench_lang", {"questions": args.questions, "shots": N_SHOTS, "runs": runs})
    labels = list(runs)
    bar_chart("bench_lang", labels, [r["programs_s"] for r in runs.values()], "programs / s",
              f"HellaSwag-style select, {args.questions} questions, 20-shot prefix")
    on = runs["radixlm run_batch"]
    parts = [f"{name}: {r['programs_s']:.2f} prog/s (hit {r['hit_rate']:.0%}, "
             f"acc {r['accuracy']:.0%})" for name, r in runs.items()]
    speedup = on["programs_s"] / runs["radixlm run_batch, no radix cache"]["programs_s"]
    print(f"bench_lang: {'; '.join(parts)}; radix speedup {speedup:.1f}x -> {path}")


if __name__ == "__main__":
    main()
