#!/usr/bin/env bash
# The GPU work left open by ../qk-norm-rope-2026-12-05/ (where each step's reason is), on one H200, steps in
# order of need (about 28 minutes after start-up: the last two steps may not fit one lease's device time).
# Run from a tree of main; wheels the machine lacks (pydantic & co., kernels, tomlkit, liger-kernel,
# diffusers) in $WHEELS (default .whl/ of the tree). Writes to $R (default /tmp/res), touches $R/JOB_DONE.
set -u
R=${R:-/tmp/res}; HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$R"
source scripts/device_env.sh "$R" > "$R/pip.log" 2>&1
OPS="rmsnorm fused_add_rmsnorm qk_norm_rope silu_mul rope cross_entropy"
ROTARY="rope_interleaved rope_apply rope3d rope3d_qk rope3d_coords rope_flux rope_wan qk_norm_rope_flux qk_norm_rope_wan"
python3 -m kgen build $OPS $ROTARY --arch sm_90 --compile --jobs 16 --out /tmp/kb > "$R/build.log" 2>&1
# two launcher variants (chunks.patch, bounds.patch), each built beside main's (rope and qk_norm_rope only)
for v in chunks bounds; do
  cp -r "$PWD" "/tmp/$v" && (cd "/tmp/$v" && patch -p1 < "$HERE/$v.patch" &&
      PYTHONPATH="/tmp/$v:/tmp/site" python3 -m kgen build rope qk_norm_rope --arch sm_90 --compile --jobs 8 --out "/tmp/k-$v") > "$R/build-$v.log" 2>&1 &
done
# 0. why qk_norm_rope runs at 53-57 % of a copy: Nsight Compute's counters at its suite shapes, rope's beside
timeout 240 python3 scripts/ncu_counters.py qk_norm_rope rope --build-dir /tmp/kb --out "$R/ncu.md" > "$R/ncu.log" 2>&1
echo "ncu rc=$? $(date)" >> "$R/progress"
# 1. the derived backwards the last run could not reach (the fixture now builds only the selected ops)
KGEN_TEST_BUILD_ROOT=/tmp/kb timeout 360 python3 -m pytest -m gpu -p no:cacheprovider -q -rfEs -k rope \
    tests/test_backward_gpu.py > "$R/t-rotary-backward.log" 2>&1
echo "rotary backward tests rc=$? $(date)" >> "$R/progress"
KGEN_TEST_BUILD_ROOT=/tmp/kb timeout 240 python3 -m pytest -m gpu -p no:cacheprovider -q -rfEs -k fused_add_rmsnorm \
    tests/test_backward_gpu.py > "$R/t-fused-add-backward.log" 2>&1
echo "fused_add_rmsnorm backward tests rc=$? $(date)" >> "$R/progress"
# 2. Qwen3-8B prefill and decode: before (kgen's unfused RMSNorm, transformers' rotation) and after (both
#    fusions), with the kernel tables
timeout 420 python3 "$HERE/before.py" "$R/before" /tmp/kb > "$R/before.log" 2>&1
timeout 540 python3 -m kgen bench --e2e qwen3 --profile --out "$R/after" --build-dir /tmp/kb > "$R/after.log" 2>&1
echo "e2e qwen3 rc=$? $(date)" >> "$R/progress"
# 3. the launcher variants, each measured against main's in one process
wait
for v in chunks bounds; do
  timeout 200 python3 scripts/variants.py /tmp/kb "/tmp/k-$v" rope qk_norm_rope > "$R/variants-$v.log" 2>&1
  echo "variants $v rc=$? $(date)" >> "$R/progress"
done
# 4. the training steps (compare with ../e2e-qwen3-train.md; wan-train never ran on a GPU)
timeout 420 python3 -m kgen bench --e2e qwen3-train --out "$R/after" --build-dir /tmp/kb > "$R/train.log" 2>&1
echo "e2e qwen3-train rc=$? $(date)" >> "$R/progress"
timeout 420 python3 -m kgen bench --e2e qwen3 --graphs --out "$R/after" --build-dir /tmp/kb > "$R/graphs.log" 2>&1
echo "e2e qwen3 --graphs rc=$? $(date)" >> "$R/progress"
timeout 480 python3 -m kgen bench --e2e wan-train --out "$R/after" --build-dir /tmp/kb > "$R/wan-train.log" 2>&1
echo "e2e wan-train rc=$? $(date)" >> "$R/progress"
touch "$R/JOB_DONE"
