#!/usr/bin/env bash
# The GPU work prepared for the next lease (README.md: why each step and what it predicts), on one H200, steps in
# order of need: about 35 minutes after start-up with every step, so the last ones will not fit one lease's device
# time. Run from a tree of main; wheels the machine lacks (pydantic & co., kernels, tomlkit, liger-kernel,
# diffusers) in $WHEELS (default .whl/ of the tree). Writes to $R (default /tmp/res), touches $R/JOB_DONE.
set -u
R=${R:-/tmp/res}; HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$R"
source scripts/device_env.sh "$R" > "$R/pip.log" 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv > "$R/gpu.txt" 2>&1
done_() { echo "$1 rc=$2 $(date)" >> "$R/progress"; }
OPS="rmsnorm fused_add_rmsnorm qk_norm_rope silu_mul rope cross_entropy"
ROTARY="rope_interleaved rope_apply rope3d rope3d_qk rope3d_coords rope_flux rope_wan qk_norm_rope_flux qk_norm_rope_wan"
python3 -m kgen build $OPS $ROTARY silu_and_mul residual_adaln_rmsnorm --arch sm_90 --compile --jobs 16 --out /tmp/kb > "$R/build.log" 2>&1
done_ build $?
# two template variants, each a tree of main with its patch, built beside main's
variant() {  # variant NAME OP...
  cp -r "$PWD" "/tmp/$1" && (cd "/tmp/$1" && patch -p1 < "$HERE/$1.patch" &&
      PYTHONPATH="/tmp/$1:/tmp/site" python3 -m kgen build "${@:2}" --arch sm_90 --compile --jobs 8 --out "/tmp/k-$1") \
      > "$R/build-$1.log" 2>&1
}
variant shares qk_norm_rope qk_norm_rope_flux &
SHARES=$!
variant chunks rope qk_norm_rope &
CHUNKS=$!
# 1. Qwen3-8B prefill and decode with qk_norm_rope's fewer registers (the H100 run before them: compile + kgen /
#    compile 1.010 prefill, 0.971 decode), with the kernel tables; then decode as users run it, under CUDA graphs
timeout 540 python3 -m kgen bench --e2e qwen3 --profile --out "$R/after" --build-dir /tmp/kb > "$R/qwen3.log" 2>&1
done_ "e2e qwen3" $?
timeout 420 python3 -m kgen bench --e2e qwen3 --graphs --out "$R/after" --build-dir /tmp/kb > "$R/graphs.log" 2>&1
done_ "e2e qwen3 --graphs" $?
# 2. qk_norm_rope_flux's backward ran 0.88x with the one-weight shares on an H100 (same grid, 110 -> 106
#    registers, two blocks an SM either way): the shares split undone (shares.patch) against main, on this GPU
wait $SHARES
done_ "build shares" $?
timeout 200 python3 scripts/variants.py /tmp/k-shares /tmp/kb qk_norm_rope_flux qk_norm_rope > "$R/variants-shares.log" 2>&1
done_ "variants shares" $?
# 3. the suite's rotary ops after the change, and the two ops the H100 suite did not reach
timeout 420 python3 -m kgen bench qk_norm_rope --out "$R/suite" --build-dir /tmp/kb > "$R/suite.log" 2>&1
for op in rope rope_interleaved silu_and_mul silu_mul; do
  timeout 200 python3 -m kgen bench $op --out "$R/suite" --build-dir /tmp/kb >> "$R/suite.log" 2>&1
done
done_ "suite ops" $?
# 4. the derived backwards a run has not reached yet
KGEN_TEST_BUILD_ROOT=/tmp/kb timeout 360 python3 -m pytest -m gpu -p no:cacheprovider -q -rfEs -k rope \
    tests/test_backward_gpu.py > "$R/t-rotary-backward.log" 2>&1
done_ "rotary backward tests" $?
KGEN_TEST_BUILD_ROOT=/tmp/kb timeout 240 python3 -m pytest -m gpu -p no:cacheprovider -q -rfEs -k fused_add_rmsnorm \
    tests/test_backward_gpu.py > "$R/t-fused-add-backward.log" 2>&1
done_ "fused_add_rmsnorm backward tests" $?
# 5. Qwen3-8B before the decoder fusions (kgen's unfused RMSNorm, transformers' rotation): the before of 1
timeout 420 python3 "$HERE/before.py" "$R/before" /tmp/kb > "$R/before.log" 2>&1
done_ "qwen3 before" $?
# 6. the launcher's head chunks against main
wait $CHUNKS
timeout 200 python3 scripts/variants.py /tmp/kb /tmp/k-chunks rope qk_norm_rope > "$R/variants-chunks.log" 2>&1
done_ "variants chunks" $?
# 7. Nsight Compute's counters at the suite shapes of qk_norm_rope, rope and residual_adaln_rmsnorm (the per-batch
#    cliff: 0.91x torch.compile at LTX-Video's shapes on the H100, 0.79-0.84x on the H200), main's kernels
timeout 300 python3 scripts/ncu_counters.py qk_norm_rope rope residual_adaln_rmsnorm --build-dir /tmp/kb --out "$R/ncu.md" > "$R/ncu.log" 2>&1
done_ ncu $?
# 8. the training steps (compare with ../e2e-qwen3-train.md; wan-train never ran on a GPU)
timeout 420 python3 -m kgen bench --e2e qwen3-train --out "$R/after" --build-dir /tmp/kb > "$R/train.log" 2>&1
done_ "e2e qwen3-train" $?
timeout 480 python3 -m kgen bench --e2e wan-train --out "$R/after" --build-dir /tmp/kb > "$R/wan-train.log" 2>&1
done_ "e2e wan-train" $?
touch "$R/JOB_DONE"
