#!/usr/bin/env bash
# The GPU check of the decoder layers' fused residual adds (kgen.integrations.decoder), of Qwen3's q/k norms
# fused with the rotation (qk_norm_rope, kgen.integrations.attention) and of `kgen bench --e2e qwen3 --graphs`,
# and the rotary launcher's GPU tests, on one H200 (about 27 minutes after start-up, steps in order of need).
# Run from a tree of main; wheels the machine lacks (pydantic & co., kernels, tomlkit, liger-kernel,
# diffusers) in $WHEELS (default .whl/ of the tree). Writes to $R (default /tmp/res), touches $R/JOB_DONE.
set -u
export PYTHONUNBUFFERED=1
R=${R:-/tmp/res}; WHEELS=${WHEELS:-.whl}; HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$R"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$WHEELS"/*.whl > "$R/pip.log" 2>&1
export PYTHONPATH=$PWD:/tmp/site
nvidia-smi --query-gpu=name,driver_version --format=csv > "$R/device.txt" 2>&1
OPS="rmsnorm fused_add_rmsnorm qk_norm_rope silu_mul rope cross_entropy"
ROTARY="rope_interleaved rope_apply rope3d rope3d_qk rope3d_coords rope_flux rope_wan qk_norm_rope_flux qk_norm_rope_wan"
python3 -m kgen build $OPS $ROTARY --arch sm_90 --compile --jobs 16 --out /tmp/kb > "$R/build.log" 2>&1
# 0. the rotary launcher as one launch per kernel (60803ca) and qk_norm_rope's kernels (never run before): the
#    rotary GPU tests, forward and backward; then qk_norm_rope against its peers, forward and backward
KGEN_TEST_BUILD_ROOT=/tmp/kb timeout 300 python3 -m pytest -m gpu -p no:cacheprovider -q -rfEs \
    tests/test_rotary_gpu.py tests/test_rotary_norm_gpu.py > "$R/t-rotary.log" 2>&1
KGEN_TEST_BUILD_ROOT=/tmp/kb timeout 300 python3 -m pytest -m gpu -p no:cacheprovider -q -rfEs -k rope \
    tests/test_backward_gpu.py > "$R/t-rotary-backward.log" 2>&1
# fused_add_rmsnorm's backward reading the saved residual_out instead of x and residual
KGEN_TEST_BUILD_ROOT=/tmp/kb timeout 240 python3 -m pytest -m gpu -p no:cacheprovider -q -rfEs -k fused_add_rmsnorm \
    tests/test_backward_gpu.py > "$R/t-fused-add-backward.log" 2>&1
# qk_norm_rope in the per-op GPU tests that take every op: argument errors, the project's own test and bench
KGEN_TEST_BUILD_ROOT=/tmp/kb timeout 200 python3 -m pytest -m gpu -p no:cacheprovider -q -rfEs -k "qk_norm_rope and not flux and not wan" \
    tests/test_errors_gpu.py tests/test_ops_gpu.py > "$R/t-qk-norm-rope.log" 2>&1
echo "rotary tests rc=$? $(date)" >> "$R/progress"
timeout 200 python3 -m kgen bench qk_norm_rope --build-dir /tmp/kb --out "$R/bench" > "$R/bench.log" 2>&1
timeout 200 python3 -m kgen bench qk_norm_rope --backward --build-dir /tmp/kb --out "$R/bench" >> "$R/bench.log" 2>&1
echo "bench qk_norm_rope rc=$? $(date)" >> "$R/progress"
# 1. the integration on the real kernels: bitwise against kgen's unfused RMSNorm, hidden states, checkpointing,
#    one graph under torch.compile, CUDA-graph capture (Qwen3-8B / Llama-3-8B configs, two or three layers)
KGEN_TEST_BUILD_ROOT=/tmp/kb timeout 400 python3 -m pytest -m gpu -p no:cacheprovider -q -rfEs \
    tests/test_transformers_integration.py > "$R/t-transformers.log" 2>&1
echo "tests rc=$? $(date)" >> "$R/progress"
# 2. Qwen3-8B prefill and decode: before (kgen's unfused RMSNorm, transformers' rotation) and after, then
#    compiled as reduce-overhead
timeout 420 python3 "$HERE/before.py" "$R/before" /tmp/kb > "$R/before.log" 2>&1
timeout 500 python3 -m kgen bench --e2e qwen3 --profile --out "$R/after" --build-dir /tmp/kb > "$R/after.log" 2>&1
echo "e2e qwen3 done $(date)" >> "$R/progress"
timeout 420 python3 -m kgen bench --e2e qwen3 --graphs --out "$R/after" --build-dir /tmp/kb > "$R/graphs.log" 2>&1
echo "e2e qwen3 --graphs done $(date)" >> "$R/progress"
# 3. the training step (compare with ../e2e-qwen3-train-*/ and BENCHMARKS.md)
timeout 420 python3 -m kgen bench --e2e qwen3-train --out "$R/after" --build-dir /tmp/kb > "$R/train.log" 2>&1
echo "e2e qwen3-train done $(date)" >> "$R/progress"
# 3b. Wan 2.1 1.3B's training step (4 blocks, 32760 tokens), never run on a GPU
timeout 480 python3 -m kgen bench --e2e wan-train --out "$R/after" --build-dir /tmp/kb > "$R/wan-train.log" 2>&1
echo "e2e wan-train done $(date)" >> "$R/progress"
# 4. if time is left: LTX-Video's training step compiled as reduce-overhead, where CUDA graphs take away the host
#    time per kgen call that made torch.compile + kgen slower than its kernels (BENCHMARKS.md, 2026-12-03)
timeout 420 python3 -m kgen bench --e2e ltx-train --graphs --out "$R/after" --build-dir /tmp/kb > "$R/ltx-graphs.log" 2>&1
echo "e2e ltx-train --graphs done $(date)" >> "$R/progress"
touch "$R/JOB_DONE"
