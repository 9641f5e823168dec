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
# 1. Qwen3-8B prefill and decode with the causal mask left to SDPA's is_causal under torch.compile (and
#    qk_norm_rope's fewer registers), with the kernel tables: attention's time per variant shows the mask's part
timeout 540 python3 -m kgen bench --e2e qwen3 --profile --out "$R/after" --build-dir /tmp/kb > "$R/qwen3.log" 2>&1
done_ "e2e qwen3" $?
# 2. the training step, the same change (the H200 before: compile + kgen / compile 1.000)
timeout 480 python3 -m kgen bench --e2e qwen3-train --profile --out "$R/after" --build-dir /tmp/kb > "$R/train.log" 2>&1
done_ "e2e qwen3-train" $?
# 3. the transformers integration on the real kernels (the new mask test among them)
KGEN_TEST_BUILD_ROOT=/tmp/kb timeout 300 python3 -m pytest -m gpu -p no:cacheprovider -q -rfEs \
    tests/test_transformers_integration.py > "$R/t-transformers.log" 2>&1
done_ "transformers integration tests" $?
# 4. qk_norm_rope_flux's backward ran 0.88x with the one-weight shares on an H100: the split undone against main
wait $SHARES
done_ "build shares" $?
timeout 200 python3 scripts/variants.py /tmp/k-shares /tmp/kb qk_norm_rope_flux qk_norm_rope > "$R/variants-shares.log" 2>&1
done_ "variants shares" $?
# 5. the derived backwards a run has not reached yet
KGEN_TEST_BUILD_ROOT=/tmp/kb timeout 360 python3 -m pytest -m gpu -p no:cacheprovider -q -rfEs -k rope \
    tests/test_backward_gpu.py > "$R/t-rotary-backward.log" 2>&1
done_ "rotary backward tests" $?
KGEN_TEST_BUILD_ROOT=/tmp/kb timeout 240 python3 -m pytest -m gpu -p no:cacheprovider -q -rfEs -k fused_add_rmsnorm \
    tests/test_backward_gpu.py > "$R/t-fused-add-backward.log" 2>&1
done_ "fused_add_rmsnorm backward tests" $?
# 6. the suite's rotary ops after the register cut, and the two ops the H100 suite did not reach
for op in qk_norm_rope rope rope_interleaved silu_and_mul silu_mul; do
  timeout 300 python3 -m kgen bench $op --out "$R/suite" --build-dir /tmp/kb >> "$R/suite.log" 2>&1
done
done_ "suite ops" $?
# 7. Nsight Compute's counters at the suite shapes (residual_adaln_rmsnorm: the per-batch cliff)
timeout 300 python3 scripts/ncu_counters.py residual_adaln_rmsnorm qk_norm_rope rope --build-dir /tmp/kb --out "$R/ncu.md" > "$R/ncu.log" 2>&1
done_ ncu $?
# 8. decode as users run it (CUDA graphs), the head chunks variant, the Wan training step
timeout 420 python3 -m kgen bench --e2e qwen3 --graphs --out "$R/after" --build-dir /tmp/kb > "$R/graphs.log" 2>&1
done_ "e2e qwen3 --graphs" $?
wait $CHUNKS
timeout 200 python3 scripts/variants.py /tmp/kb /tmp/k-chunks rope qk_norm_rope > "$R/variants-chunks.log" 2>&1
done_ "variants chunks" $?
timeout 480 python3 -m kgen bench --e2e wan-train --out "$R/after" --build-dir /tmp/kb > "$R/wan-train.log" 2>&1
done_ "e2e wan-train" $?
touch "$R/JOB_DONE"
