"""Time to ready and memory of ``radixlm serve`` vs llama.cpp's server on the same GGUF.

For each server: the seconds from launch until ``/v1/models`` answers, the RSS of its whole
process tree (server plus children) at idle once started (for radixlm: once its CPU steps have
compiled, in the background after ready), and the peak RSS from launch to the end of a short load
(``--requests`` completions of ``--max-tokens`` tokens, ``--concurrency`` at a time), sampled
every 0.1 s. radixlm runs twice: by default and with ``--low-memory`` (each weight held once,
as int4/int8; decode steps compiled ahead of time by a child process and loaded from disk: run
the benchmark once before measuring, so that neither the default's inductor cache nor these
packages are cold). Writes ``results/bench_startup.json`` and a plot; prints one
summary line.

    python benchmarks/bench_startup.py                 # needs llama-cpp-python[server]
    python benchmarks/bench_startup.py --only radixlm
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_serving import free_port  # noqa: E402
from common import bar_chart, log, save  # noqa: E402

from radixlm.runtime.launcher import rss_bytes  # noqa: E402

# NOTE: a prompt a base completion continues (a question made the model stop at once)
PROMPT = "Here is a long list of animals, one per line:\n1. cat\n2. dog\n3."


def tree_rss(pid: int) -> int:
    """Bytes resident in ``pid`` and all its descendants (from /proc; every thread's children:
    the scheduler starts its compile process from a thread)."""
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        total += rss_bytes(p) or 0
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{p}/task/{task}/children") as f:
                    stack.extend(int(c) for c in f.read().split())
            except OSError:
                continue
    return total


class PeakSampler:
    """Samples the tree's RSS every 0.1 s on a thread, keeping the peak."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_rss(self.pid))
            time.sleep(0.1)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


KINDS = ("radixlm", "radixlm_low_memory", "llamacpp")


def wait_compiled(url: str, timeout: float = 600) -> None:
    """Until radixlm's compiled CPU steps are ready (or off, or failed): its steady state."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stats = httpx.get(f"{url}/get_server_info", timeout=10).json()["stats"]
        if stats.get("cpu_compile") != "compiling":
            return
        time.sleep(1.0)
    raise SystemExit("radixlm's CPU steps did not compile in time")


def command(kind: str, model: str, port: int, threads: int) -> list[str]:
    if kind.startswith("radixlm"):
        low = ["--low-memory"] if kind == "radixlm_low_memory" else []
        return [sys.executable, "-m", "radixlm.server", "--model-path", model,
                "--port", str(port), *low]  # fmt: skip
    return [sys.executable, "-m", "llama_cpp.server", "--model", model, "--port", str(port),
            "--host", "127.0.0.1", "--n_ctx", "4096", "--n_threads", str(threads),
            "--interrupt_requests", "False"]  # fmt: skip


def measure(kind: str, model: str, threads: int, args: argparse.Namespace) -> dict[str, float]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    started = time.perf_counter()
    proc = subprocess.Popen(command(kind, model, port, threads),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    sampler = PeakSampler(proc.pid)
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"{kind} exited with code {proc.returncode} while starting")
            try:
                models = httpx.get(f"{url}/v1/models", timeout=2)
                if models.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        ready_s = time.perf_counter() - started
        if kind.startswith("radixlm"):
            wait_compiled(url)
        time.sleep(2.0)
        idle = tree_rss(proc.pid)
        log(f"{kind}: ready in {ready_s:.1f} s, idle RSS {idle / 2**20:.0f} MiB; serving...")
        parts = {}
        if kind.startswith("radixlm"):  # NOTE: each process's share, as /get_server_info says
            info = httpx.get(f"{url}/get_server_info", timeout=10).json()
            parts = {k: round(v / 2**20) for k, v in info["rss_bytes"].items() if v}
            log(f"  per process (MiB): {parts}")
        name = models.json()["data"][0]["id"]
        body = {"model": name, "prompt": PROMPT, "max_tokens": args.max_tokens, "temperature": 0}
        with httpx.Client(base_url=url, timeout=600) as client, ThreadPoolExecutor(
            args.concurrency
        ) as pool:
            done = list(pool.map(lambda _: client.post("/v1/completions", json=body),
                                 range(args.requests)))  # fmt: skip
        assert all(r.status_code == 200 for r in done), [r.text for r in done][:1]
        tokens = sum(r.json()["usage"]["completion_tokens"] for r in done)
        peak = sampler.stop()
    finally:
        sampler.stop()
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    log(f"{kind}: peak RSS {peak / 2**20:.0f} MiB ({tokens} tokens served)")
    out = {"ready_s": ready_s, "idle_rss_mib": idle / 2**20, "peak_rss_mib": peak / 2**20,
           "tokens_served": tokens}  # fmt: skip
    return {**out, "idle_rss_by_process_mib": parts} if parts else out


def main() -> None:
    from radixlm.runtime.loader.model_files import default_model_path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=KINDS)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    model = default_model_path()
    threads = os.cpu_count()  # NOTE: llama.cpp with every core, as users run it
    kinds = [args.only] if args.only else list(KINDS)
    if "llamacpp" in kinds and importlib.util.find_spec("llama_cpp") is None:
        log("llama.cpp is missing (pip install 'llama-cpp-python[server]'): radixlm only")
        kinds.remove("llamacpp")
    results = {}
    for kind in kinds:
        log(f"starting {kind} on {os.path.basename(model)} ({threads} compute threads)")
        results[kind] = measure(kind, model, threads, args)
    ratios = {}
    c = results.get("llamacpp")
    for kind, r in results.items():
        if c is None or kind == "llamacpp":
            continue
        prefix = "" if kind == "radixlm" else "low_memory_"
        ratios.update({
            f"{prefix}ready_time_vs_llama_cpp": r["ready_s"] / c["ready_s"],
            f"{prefix}idle_rss_vs_llama_cpp": r["idle_rss_mib"] / c["idle_rss_mib"],
            f"{prefix}peak_rss_vs_llama_cpp": r["peak_rss_mib"] / c["peak_rss_mib"],
        })  # fmt: skip
    path = save("bench_startup", {"config": vars(args), "threads": threads, "results": results,
                                  "ratios": ratios})  # fmt: skip
    labels = [f"{k} {m}" for k in results for m in ("idle", "peak")]
    values = [results[k][f"{m}_rss_mib"] for k in results for m in ("idle", "peak")]
    bar_chart("bench_startup", labels, values, "RSS (MiB)", "Serving memory, whole process tree")
    summary = ", ".join(
        f"{k}: ready {v['ready_s']:.1f} s, idle {v['idle_rss_mib']:.0f} MiB, "
        f"peak {v['peak_rss_mib']:.0f} MiB"
        for k, v in results.items()
    )
    extra = "".join(f", {k} {v:.2f}x" for k, v in ratios.items())
    print(f"bench_startup: {summary}{extra} ({path})", flush=True)


if __name__ == "__main__":
    main()
