#!/usr/bin/env bash
# GPU checks for one H200, under 8 minutes (timeouts 75 + 150 + 210 s): compiled kernel tests,
# the kernel benchmark, then the Engine benchmark (8B-shaped decode/prefill, CUDA graphs on/off,
# backend agreement).
# Usage: bash benchmarks/gpu/run.sh [--smoke]   (results under $OUT, default benchmarks/gpu/out)
# The kernel steps need only torch + triton (+ pytest); the Engine step also needs pyzmq and
# msgspec: run benchmarks/gpu/fetch_wheels.sh here first and carry `.whl` with the call.
# At most 8 files come back from $OUT: nvidia_smi.txt, pytest_kernels.log, bench_kernels.log,
# gpu_kernels.json, bench_engine.log, gpu_engine.json, gpu_engine.png.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-benchmarks/gpu/out}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv \
    >"$OUT/nvidia_smi.txt" 2>&1 || true

status=0
if [[ "${1:-}" != "--smoke" ]]; then
    timeout 75 "$PY" -m pytest -q -rfE -p no:cacheprovider --noconftest --timeout=60 \
        tests/kernels/test_cuda_graph_runner.py tests/kernels \
        --deselect tests/kernels/test_kernel_engine_triton.py \
        >"$OUT/pytest_kernels.log" 2>&1
    echo "pytest tests/kernels exit=$?" | tee -a "$OUT/pytest_kernels.log"
fi

timeout 150 "$PY" benchmarks/gpu/bench_kernels.py --out "$OUT" "$@" 2>&1 | tee "$OUT/bench_kernels.log"
status=$((status | $?))

timeout 210 "$PY" benchmarks/gpu/bench_engine.py --out "$OUT" "$@" 2>&1 | tee "$OUT/bench_engine.log"
status=$((status | $?))

exit "$status"
