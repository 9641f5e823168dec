#!/usr/bin/env bash
# The GPU work prepared for the next lease (README.md: why each step and what it predicts), on one H200 if one can
# be had, steps in order of need (1, 5, 2, 4 inference, 3b, 3c, 4 training, 3): about 30 minutes after start-up with every step, so the last ones may not fit
# one lease's device time. Run from a tree of main; wheels the machine lacks (pydantic & co., kernels, tomlkit,
# liger-kernel, diffusers) in $WHEELS (default .whl/ of the tree). Writes to $R (default /tmp/res), touches
# $R/JOB_DONE.
set -u
R=${R:-/tmp/res}
mkdir -p "$R"
source scripts/device_env.sh "$R" > "$R/pip.log" 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv > "$R/gpu.txt" 2>&1
done_() { echo "$1 rc=$2 $(date)" >> "$R/progress"; }
python3 -m kgen build --all --arch sm_90 --compile --jobs 16 --out /tmp/kb > "$R/build.log" 2>&1
done_ build $?
# 1. the landed row kernels at 4 resident blocks and qk_norm_rope_flux's unsplit shares on the real kernels; the
#    launchers that now count the device's SMs (every row and rotary forward, the weightless rotary backwards)
timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_ops_gpu.py tests/test_backward_gpu.py \
    -k "residual_adaln_rmsnorm or adaln_layernorm or qk_norm_rope_flux" > "$R/t-landed.log" 2>&1
done_ "landed kernels tests" $?
timeout 420 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_ops_gpu.py tests/test_rotary_gpu.py \
    tests/test_rotary_norm_gpu.py tests/test_extremes.py > "$R/t-launchers.log" 2>&1
done_ "row and rotary forward tests" $?
# 5. on an H200 only: the whole suite (issue 14's one-run SUMMARY); the H100's is in ../rows-h100-2026-12-05/
if grep -q H200 "$R/gpu.txt"; then
  timeout 600 python3 -m kgen bench --all --out "$R/suite-all" --build-dir /tmp/kb > "$R/suite.log" 2>&1
  done_ suite $?
  python3 -m kgen report "$R/suite-all" > "$R/report.log" 2>&1  # REPORT.md: `kgen report DIR --into BENCHMARKS.md`
fi
# 2. Qwen3-8B decode under CUDA graphs: each cache now filled by the uncompiled module (its tensors marked static)
timeout 480 python3 -m kgen bench --e2e qwen3 --graphs --out "$R/after" --build-dir /tmp/kb > "$R/graphs.log" 2>&1
done_ "e2e qwen3 --graphs" $?
# 4. end to end on this GPU: Qwen3 prefill / decode and its training step with the mask, LTX-Video, the Wan step
timeout 540 python3 -m kgen bench --e2e qwen3 --profile --out "$R/after" --build-dir /tmp/kb > "$R/qwen3.log" 2>&1
done_ "e2e qwen3" $?
timeout 480 python3 -m kgen bench --e2e ltx --out "$R/after" --build-dir /tmp/kb > "$R/ltx.log" 2>&1
done_ "e2e ltx" $?
# 3b. the compiled rotary peers looked host-bound in events (rope 1x32x128x128: 69 us for 2.7 MB): CUDA-graph
#     replays leave the host out, so kgen's lead there is the kernels' alone
timeout 200 python3 -m kgen bench rope --graphs --out "$R/suite" --build-dir /tmp/kb > "$R/bench-rope-graphs.log" 2>&1
done_ "rope --graphs" $?
# 3c. small shapes (issue 14 item 2): each kernel's own duration, occupancy and waves at the suite's shapes, to set
#     against its 5-6 us in events (empty launch 4.0 us on the H100)
timeout 300 python3 scripts/ncu_counters.py rmsnorm layernorm rope --build-dir /tmp/kb --out "$R/ncu-small.md" \
    > "$R/ncu-small.log" 2>&1
done_ "ncu small shapes" $?
# 4b. the training steps
timeout 480 python3 -m kgen bench --e2e qwen3-train --profile --out "$R/after" --build-dir /tmp/kb > "$R/train.log" 2>&1
done_ "e2e qwen3-train" $?
timeout 540 python3 -m kgen bench --e2e wan-train --profile --out "$R/after" --build-dir /tmp/kb > "$R/wan-train.log" 2>&1
done_ "e2e wan-train" $?
# 3. qk_norm_rope_flux's backward without the split shares against its peers (the forward row ops: in the suite)
timeout 200 python3 -m kgen bench qk_norm_rope_flux --backward --out "$R/suite" --build-dir /tmp/kb \
    > "$R/bench-qk_norm_rope_flux-backward.log" 2>&1
done_ "row ops and qk_norm_rope_flux" $?
touch "$R/JOB_DONE"
