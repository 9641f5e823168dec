#!/usr/bin/env bash
# The GPU work prepared for the next lease (README.md: why each step and what it predicts), on one H200, steps in
# order of need: about 40 minutes after start-up with every step, so the last ones will not fit one lease's device
# time. Run from a tree of main; wheels the machine lacks (pydantic & co., kernels, tomlkit, liger-kernel,
# diffusers) in $WHEELS (default .whl/ of the tree). Writes to $R (default /tmp/res), touches $R/JOB_DONE.
set -u
R=${R:-/tmp/res}; HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$R"
source scripts/device_env.sh "$R" > "$R/pip.log" 2>&1
done_() { echo "$1 rc=$2 $(date)" >> "$R/progress"; }
OPS="rmsnorm fused_add_rmsnorm qk_norm_rope silu_mul rope cross_entropy"
ROTARY="rope_interleaved rope_apply rope3d rope3d_qk rope3d_coords rope_flux rope_wan qk_norm_rope_flux qk_norm_rope_wan"
FLUX="adaln_layernorm residual_adaln_layernorm gelu_tanh"
python3 -m kgen build $OPS $ROTARY $FLUX --arch sm_90 --compile --jobs 16 --out /tmp/kb > "$R/build.log" 2>&1
done_ build $?
# three template variants, each a tree of main with its patch, built beside main's
variant() {  # variant NAME OP...
  cp -r "$PWD" "/tmp/$1" && (cd "/tmp/$1" && patch -p1 < "$HERE/$1.patch" &&
      PYTHONPATH="/tmp/$1:/tmp/site" python3 -m kgen build "${@:2}" --arch sm_90 --compile --jobs 8 --out "/tmp/k-$1") \
      > "$R/build-$1.log" 2>&1
}
variant registers qk_norm_rope rope rmsnorm $ROTARY &
REGISTERS=$!
variant chunks rope qk_norm_rope &
variant bounds rope qk_norm_rope &
# 0. Flux.1 with the blocks' residual adds handed on to the next norm (landed, CPU-verified only): its GPU tests
KGEN_TEST_BUILD_ROOT=/tmp/kb timeout 300 python3 -m pytest -m gpu -p no:cacheprovider -q -rfEs \
    tests/test_flux_integration.py > "$R/t-flux.log" 2>&1
done_ "flux tests" $?
wait $REGISTERS
done_ "build registers" $?
# 1. registers.patch: the rotary tests on its build (a new weight-gradient partition in the fused q/k norm
#    kernels' backward), then the ops whose registers it changes timed against main's
(cd /tmp/registers && PYTHONPATH="/tmp/registers:/tmp/site" KGEN_TEST_BUILD_ROOT=/tmp/k-registers timeout 300 \
    python3 -m pytest -m gpu -p no:cacheprovider -q -rfEs tests/test_rotary_norm_gpu.py tests/test_rotary_gpu.py) \
    > "$R/t-registers.log" 2>&1
done_ "registers tests" $?
timeout 300 python3 scripts/variants.py /tmp/kb /tmp/k-registers qk_norm_rope qk_norm_rope_flux rope rope_interleaved qk_norm_rope_wan \
    > "$R/variants-registers.log" 2>&1
done_ "variants registers" $?
# 2. Flux.1 end to end (its tests ran in 0)
timeout 420 python3 -m kgen bench --e2e flux --repeats 10 --out "$R/after" --build-dir /tmp/kb > "$R/flux.log" 2>&1
done_ "e2e flux" $?
# 3. Qwen3-8B prefill and decode with both fusions (the decoder layers' residual adds, the q/k norms with the
#    rotation), with the kernel tables; the same before the fusions comes in 5
timeout 540 python3 -m kgen bench --e2e qwen3 --profile --out "$R/after" --build-dir /tmp/kb > "$R/after.log" 2>&1
done_ "e2e qwen3" $?
# 3b. the suite (every op against its peers, SUMMARY.md): the last full run is of 2026-11-30
timeout 420 python3 -m kgen bench --all --rounds 3 --out "$R/suite" --build-dir /tmp/kb > "$R/suite.log" 2>&1
done_ "bench --all" $?
# 4. the derived backwards a run has not reached yet
KGEN_TEST_BUILD_ROOT=/tmp/kb timeout 360 python3 -m pytest -m gpu -p no:cacheprovider -q -rfEs -k rope \
    tests/test_backward_gpu.py > "$R/t-rotary-backward.log" 2>&1
done_ "rotary backward tests" $?
KGEN_TEST_BUILD_ROOT=/tmp/kb timeout 240 python3 -m pytest -m gpu -p no:cacheprovider -q -rfEs -k fused_add_rmsnorm \
    tests/test_backward_gpu.py > "$R/t-fused-add-backward.log" 2>&1
done_ "fused_add_rmsnorm backward tests" $?
# 5. Qwen3-8B before the fusions (kgen's unfused RMSNorm, transformers' rotation): the before of 3
timeout 420 python3 "$HERE/before.py" "$R/before" /tmp/kb > "$R/before.log" 2>&1
done_ "qwen3 before" $?
# 6. the other two launcher variants, each measured against main's in one process
wait
for v in chunks bounds; do
  timeout 200 python3 scripts/variants.py /tmp/kb "/tmp/k-$v" rope qk_norm_rope > "$R/variants-$v.log" 2>&1
  done_ "variants $v" $?
done
# 7. Nsight Compute's counters at the suite shapes of qk_norm_rope and rope, main's kernels
timeout 240 python3 scripts/ncu_counters.py qk_norm_rope rope --build-dir /tmp/kb --out "$R/ncu.md" > "$R/ncu.log" 2>&1
done_ ncu $?
# 8. the training steps (compare with ../e2e-qwen3-train.md; wan-train never ran on a GPU) and Qwen3 under
#    CUDA graphs
timeout 420 python3 -m kgen bench --e2e qwen3-train --out "$R/after" --build-dir /tmp/kb > "$R/train.log" 2>&1
done_ "e2e qwen3-train" $?
timeout 420 python3 -m kgen bench --e2e qwen3 --graphs --out "$R/after" --build-dir /tmp/kb > "$R/graphs.log" 2>&1
done_ "e2e qwen3 --graphs" $?
timeout 480 python3 -m kgen bench --e2e wan-train --out "$R/after" --build-dir /tmp/kb > "$R/wan-train.log" 2>&1
done_ "e2e wan-train" $?
touch "$R/JOB_DONE"
