#!/usr/bin/env bash
# GPU checks for one H200 (< 8 min): compiled kernel tests, then the kernel benchmark.
# Usage: bash benchmarks/gpu/run.sh [--smoke]   (results under $OUT, default benchmarks/gpu/out)
# Needs only torch + triton (+ pytest for the test step): never the server's dependencies.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-benchmarks/gpu/out}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv \
    >"$OUT/nvidia_smi.txt" 2>&1 || true

if [[ "${1:-}" != "--smoke" ]]; then
    timeout 150 "$PY" -m pytest -q -p no:cacheprovider --noconftest tests/kernels \
        >"$OUT/pytest_kernels.log" 2>&1
    echo "pytest tests/kernels exit=$?" | tee -a "$OUT/pytest_kernels.log"
fi

timeout 300 "$PY" benchmarks/gpu/bench_kernels.py --out "$OUT" "$@" 2>&1 | tee "$OUT/bench_kernels.log"
status=$?

# --- End-to-end Engine benchmark: the lead adds its command here (its own timeout, its own
# JSON file under $OUT; at most 8 files come back from $OUT in all). ---

exit "$status"
