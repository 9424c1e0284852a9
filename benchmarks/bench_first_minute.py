"""The first minute after a fresh start, as a user meets it: ``radixlm serve`` (cold caches: a
first start on a new machine, its CPU step graphs not built yet; warm: a restart, the graphs on
disk) against llama.cpp's server on the same GGUF with every core (``--n_threads`` = cores, as
users run it).

Each server is started fresh; from the moment ``/v1/models`` answers, one client sends greedy
``/v1/completions`` of ``--max-tokens`` tokens one after another for ``--seconds`` (60) and
records each one's decode speed (completion tokens over the request's time) and when it
ended. The cold run uses a new ``$RADIXLM_CACHE`` and ``$TORCHINDUCTOR_CACHE_DIR`` (nothing
built: the C++ kernels, the tokenizer, the graphs); it is kept running until its graphs are
built, then the warm run restarts on the same caches. Each run also records its process
tree's RSS after the minute and its peak (sampled every 0.1 s from launch). Writes
``results/bench_first_minute.json`` and a plot of each request's tok/s against its time since
ready; prints one summary line.

    python benchmarks/bench_first_minute.py        # needs llama-cpp-python[server]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_serving import free_port  # noqa: E402
from bench_startup import PeakSampler, tree_rss  # noqa: E402
from common import RESULTS_DIR, log, save  # noqa: E402

PROMPT = "Here is a long list of animals, one per line:\n1. cat\n2. dog\n3."
GRAPHS_TIMEOUT_S = 1200


def start(kind: str, env: dict[str, str]) -> tuple[subprocess.Popen, str, float]:
    """Start ``kind`` ("radixlm" or "llamacpp"); its process, URL, and seconds to ready."""
    from radixlm.runtime.loader.model_files import default_model_path

    port, model = free_port(), default_model_path()
    if kind == "radixlm":
        cmd = [sys.executable, "-m", "radixlm.server", "--model-path", model, "--port", str(port)]
    else:
        cores = str(os.cpu_count())
        cmd = [sys.executable, "-m", "llama_cpp.server", "--model", model, "--port", str(port),
               "--host", "127.0.0.1", "--n_ctx", "4096", "--n_threads", cores,
               "--n_threads_batch", cores, "--interrupt_requests", "False"]  # fmt: skip
    url, started = f"http://127.0.0.1:{port}", time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"{kind} exited with code {proc.returncode} while starting")
        try:
            if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                return proc, url, time.perf_counter() - started
        except httpx.HTTPError:
            pass
        time.sleep(0.1)


def first_minute(url: str, seconds: float, max_tokens: int) -> list[dict]:
    """Sequential greedy completions for ``seconds`` from now: each one's end time (s since
    the first was sent), tokens and tok/s."""
    name = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
    body = {"model": name, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0}
    out, t0 = [], time.perf_counter()
    with httpx.Client(base_url=url, timeout=600) as client:
        while time.perf_counter() - t0 < seconds:
            sent = time.perf_counter()
            r = client.post("/v1/completions", json=body)
            r.raise_for_status()
            done = time.perf_counter()
            tokens = r.json()["usage"]["completion_tokens"]
            out.append({"end_s": round(done - t0, 2), "tokens": tokens,
                        "tok_s": round(tokens / (done - sent), 1)})  # fmt: skip
    return out


def graphs_status(url: str) -> dict:
    return httpx.get(f"{url}/get_server_info", timeout=10).json()["stats"]["cpu_graphs"] or {}


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def run(kind: str, env: dict[str, str], args: argparse.Namespace, wait_graphs: bool) -> dict:
    proc, url, ready_s = start(kind, env)
    sampler = PeakSampler(proc.pid)
    try:
        log(f"{kind}: ready in {ready_s:.1f} s; the first {args.seconds:.0f} s of requests")
        requests = first_minute(url, args.seconds, args.max_tokens)
        rss, peak = tree_rss(proc.pid) / 2**20, sampler.stop() / 2**20
        graphs = graphs_status(url) if kind == "radixlm" else {}
        if wait_graphs:  # NOTE: the cold run builds the warm run's graphs
            deadline = time.monotonic() + GRAPHS_TIMEOUT_S
            while graphs_status(url).get("status") == "compiling":
                if time.monotonic() > deadline:
                    raise SystemExit("radixlm's graphs were not built in time")
                time.sleep(2)
            log(f"  graphs: {graphs_status(url).get('status')} "
                f"{time.monotonic() - deadline + GRAPHS_TIMEOUT_S:.0f} s later")  # fmt: skip
    finally:
        sampler.stop()
        stop(proc)
    tokens = sum(r["tokens"] for r in requests)
    busy = sum(r["tokens"] / r["tok_s"] for r in requests)
    summary = {"ready_s": round(ready_s, 1), "requests": len(requests),
               "first_request_tok_s": requests[0]["tok_s"], "mean_tok_s": round(tokens / busy, 1),
               "rss_after_minute_mib": round(rss), "peak_rss_mib": round(peak),
               "graphs_after_minute": graphs.get("loaded"), "per_request": requests}  # fmt: skip
    log(f"{kind}: first request {summary['first_request_tok_s']} tok/s, the minute's mean "
        f"{summary['mean_tok_s']} tok/s over {len(requests)} requests; RSS {rss:.0f} MiB, "
        f"peak {peak:.0f}")  # fmt: skip
    return summary


def plot(results: dict[str, dict]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for name, r in results.items():
        rows = r["per_request"]
        ax.plot([x["end_s"] for x in rows], [x["tok_s"] for x in rows], marker=".", label=name)
    ax.set_xlabel("seconds since ready")
    ax.set_ylabel("decode tok/s of each request")
    ax.set_title("The first minute after a fresh start, SmolLM2-135M, single stream, CPU")
    ax.legend()
    fig.tight_layout()
    path = os.path.join(RESULTS_DIR, "bench_first_minute.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="radixlm-cold-") as cold:
        env = {**os.environ, "RADIXLM_CACHE": cold,
               "TORCHINDUCTOR_CACHE_DIR": os.path.join(cold, "inductor")}  # fmt: skip
        results["radixlm_cold"] = run("radixlm", env, args, wait_graphs=True)
        results["radixlm_warm"] = run("radixlm", env, args, wait_graphs=False)
    if importlib.util.find_spec("llama_cpp") is not None:
        results["llama_cpp"] = run("llamacpp", dict(os.environ), args, wait_graphs=False)
    else:
        log("llama.cpp is missing (pip install 'llama-cpp-python[server]'): radixlm only")
    ratios = {}
    if (peer := results.get("llama_cpp")) is not None:
        for name in ("radixlm_cold", "radixlm_warm"):
            r = results[name]
            ratios[f"{name}_first_request_vs_llama_cpp"] = round(
                r["first_request_tok_s"] / peer["first_request_tok_s"], 2)  # fmt: skip
            ratios[f"{name}_mean_vs_llama_cpp"] = round(r["mean_tok_s"] / peer["mean_tok_s"], 2)
            ratios[f"{name}_peak_rss_vs_llama_cpp"] = round(r["peak_rss_mib"]
                                                            / peer["peak_rss_mib"], 2)  # fmt: skip
    path = save("bench_first_minute", {"config": vars(args), "cores": os.cpu_count(),
                                       "results": results, "ratios": ratios})  # fmt: skip
    plot(results)
    rows = ", ".join(f"{k} first {v['first_request_tok_s']} / mean {v['mean_tok_s']} tok/s"
                     for k, v in results.items())  # fmt: skip
    extra = "".join(f", {k} {v:.2f}x" for k, v in ratios.items())
    print(f"bench_first_minute: {rows}{extra} ({path})", flush=True)


if __name__ == "__main__":
    main()
