"""Helpers shared by the benchmarks: timing, the JSON result, the plot, the summary line."""

from __future__ import annotations

import json
import os
import platform
import time
from contextlib import contextmanager
from typing import Any

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


@contextmanager
def timer(into: dict, key: str):
    start = time.perf_counter()
    yield
    into[key] = time.perf_counter() - start


def machine() -> dict[str, Any]:
    import torch

    return {
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def save(name: str, result: dict[str, Any]) -> str:
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = os.path.join(RESULTS_DIR, f"{name}.json")
    result = {
        "benchmark": name,
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": machine(),
        **result,
    }
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    return path


def bar_chart(name: str, labels: list[str], values: list[float], ylabel: str, title: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(labels)), 4))
    bars = ax.bar(labels, values, color=["#3b7dd8" if "radixlm" in lb else "#999" for lb in labels])
    ax.bar_label(bars, fmt="%.2f")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    plt.xticks(rotation=20, ha="right")
    fig.tight_layout()
    path = os.path.join(RESULTS_DIR, f"{name}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def wait_compiled(engine) -> str:
    """Wait until the engine's compiled CPU steps are ready (they compile in the background
    while steps run eagerly); the final status."""
    import time

    start = time.perf_counter()
    while (status := engine.get_server_info()["stats"]["cpu_compile"]) == "compiling":
        time.sleep(1)
    if status != "off":
        log(f"  compiled CPU steps: {status} after {time.perf_counter() - start:.0f} s")
    return status
