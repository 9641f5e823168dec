#!/usr/bin/env bash
# The GPU check of what this folder prepares, on one H200 (about 8 minutes after start-up). Run from a tree of
# main with `rotary-grad-layout.patch` applied and `kgen build --all --out generated` run (git apply, then
# build); wheels the machine lacks (pydantic & co., kernels, tomlkit, liger-kernel, diffusers) in $WHEELS
# (default .whl/ of the tree). Writes to $R (default /tmp/res), touches $R/JOB_DONE at the end.
set -u
export PYTHONUNBUFFERED=1
R=${R:-/tmp/res}; WHEELS=${WHEELS:-.whl}; HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$R"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$WHEELS"/*.whl > "$R/pip.log" 2>&1
export PYTHONPATH=$PWD:/tmp/site
# 1. host time per call of the training ops' forward and backward, next to ATen's
timeout 600 python3 "$HERE/host_probe.py" /tmp/b-host > "$R/host.jsonl" 2> "$R/host.err"
echo "host probe done $(date)" >> "$R/progress"
# 2. the rotary ops' backward GPU tests (the patch's test among them)
OPS="rope rope_interleaved rope_apply rope3d rope3d_qk rope3d_coords rope_flux rope_wan"
python3 -m kgen build $OPS --arch sm_90 --compile --jobs 16 --out /tmp/b-rot > "$R/build.log" 2>&1
cp tests/test_backward_gpu.py /tmp/test_backward_gpu.orig
sed -i "s/^OPS = \[op for op in op_names() if /OPS = [op for op in op_names() if op in '$OPS'.split() and /" tests/test_backward_gpu.py
KGEN_TEST_BUILD_ROOT=/tmp/b-rot timeout 300 python3 -m pytest tests/test_backward_gpu.py -m gpu -q -p no:cacheprovider > "$R/t-backward.log" 2>&1
cp /tmp/test_backward_gpu.orig tests/test_backward_gpu.py
echo "tests done $(date)" >> "$R/progress"
# 3. Qwen3's training step (compare with ../../e2e-qwen3-train-2026-12-03c/) and its copies
timeout 420 python3 -m kgen bench --e2e qwen3-train --profile --out "$R/e2e" --build-dir /tmp/b-q > "$R/e2e.log" 2>&1
timeout 300 python3 "$HERE/../copies_probe.py" qwen3-train /tmp/b-q > "$R/copies-qwen3.log" 2>&1
echo "e2e done $(date)" >> "$R/progress"
touch "$R/JOB_DONE"
