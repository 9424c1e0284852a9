"""The shared-prefix workload: a few-shot header (~800 tokens) and many different questions."""

from __future__ import annotations

import random


def few_shot_prefix(num_shots: int = 32, seed: int = 0) -> str:
    rng = random.Random(seed)
    lines = ["Answer each arithmetic question with a single number.\n\n"]
    for _ in range(num_shots):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        lines.append(f"Question: What is the sum of {a} and {b}?\nAnswer: {a + b}\n\n")
    return "".join(lines)


def questions(n: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        out.append(f"Question: What is the sum of {a} and {b}?\nAnswer:")
    return out


def prompts(n: int, num_shots: int = 32) -> list[str]:
    prefix = few_shot_prefix(num_shots)
    return [prefix + q for q in questions(n)]
