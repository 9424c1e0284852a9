#!/usr/bin/env bash
# Fetch, here, the wheels the GPU machine lacks for the Engine benchmark (pyzmq, msgspec), for
# Python 3.12 on x86-64 Linux, into .whl/ (ignored by git). Then run the GPU script with `.whl`
# carried: benchmarks/gpu/run.sh installs them into /tmp/site when the folder is there.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-python3}"
platforms=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_26_x86_64 \
    manylinux_2_17_x86_64 manylinux2014_x86_64; do
    platforms+=(--platform "$tag")
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d .whl pyzmq==27.3.0 msgspec==0.23.0
ls -la .whl
