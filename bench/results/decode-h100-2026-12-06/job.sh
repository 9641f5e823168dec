#!/usr/bin/env bash
# The GPU work prepared for the next lease (README.md: why each step and what it predicts), steps in order of
# need: 1 every GPU test, 2 Qwen3-8B end to end with the grouped decode attention, 3 the whole suite, (on an
# H200) LTX-Video end to end, 4 ncu of the suite's misses beside torch.compile's kernels, 5 the Wan training
# step, 6 qk_norm_rope_flux's backward. About 25 minutes after start-up on an H100, 30 on an H200. Run from a
# tree of main; wheels the machine lacks (pydantic & co., kernels, tomlkit, liger-kernel, diffusers) in $WHEELS
# (default .whl/ of the tree). Writes to $R (default /tmp/res), touches $R/JOB_DONE.
set -u
R=${R:-/tmp/res}
mkdir -p "$R"
source scripts/device_env.sh "$R" > "$R/pip.log" 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv > "$R/gpu.txt" 2>&1
done_() { echo "$1 rc=$2 $(date)" >> "$R/progress"; }
python3 -m kgen build --all --arch sm_90 --compile --jobs 16 --out /tmp/kb > "$R/build.log" 2>&1
done_ build $?
export KGEN_TEST_BUILD_ROOT=/tmp/kb  # the tests load the builds above instead of compiling their own
# 1. every GPU test: the landed row kernels at 4 resident blocks and qk_norm_rope_flux's unsplit shares among them
timeout 540 python3 -m pytest tests -m gpu -q -p no:cacheprovider -rfE > "$R/t-gpu.log" 2>&1
done_ "gpu tests" $?
# 2. a decode step's attention on the grouped k/v heads against the copy (bitwise? time), then Qwen3-8B end to
#    end as decode is served (static cache, CUDA graphs), with kernel tables
timeout 120 python3 bench/results/next/gqa_check.py > "$R/gqa-check.log" 2>&1
done_ "gqa check" $?
timeout 570 python3 -m kgen bench --e2e qwen3 --graphs --profile --out "$R/e2e" --build-dir /tmp/kb > "$R/qwen3.log" 2>&1
done_ "e2e qwen3 --graphs --profile" $?
# 3. the whole suite in one run, then its report (REPORT.md; `kgen report DIR --into BENCHMARKS.md`); on an H200
#    LTX-Video end to end too (issue 14's tables from one H200 run)
timeout 420 python3 -m kgen bench --all --out "$R/suite-all" --build-dir /tmp/kb > "$R/suite.log" 2>&1
done_ suite $?
python3 -m kgen report "$R/suite-all" > "$R/report.log" 2>&1
if grep -q H200 "$R/gpu.txt"; then
  timeout 420 python3 -m kgen bench --e2e ltx --out "$R/e2e" --build-dir /tmp/kb > "$R/ltx.log" 2>&1
  done_ "e2e ltx" $?
fi
# 4. the suite's misses against torch.compile, kgen's kernel and the compiled peer's side by side under ncu
timeout 420 python3 scripts/ncu_counters.py rmsnorm layernorm fused_add_rmsnorm residual_adaln_rmsnorm \
    residual_layernorm_fp32 residual_adaln_layernorm_fp32 --peer --build-dir /tmp/kb --out "$R/ncu-peers.md" \
    --shapes 1×128×4096 64×1×4096 4096×128 2048×4096 5376×2048 2×2688×2048 "2×8064×2048 per batch" \
    "32760×5120 per batch" > "$R/ncu-peers.log" 2>&1
done_ "ncu misses with peers" $?
# 5. the Wan training step with its kernel tables (the last two runs ran out of device time before it)
timeout 480 python3 -m kgen bench --e2e wan-train --profile --out "$R/e2e" --build-dir /tmp/kb > "$R/wan-train.log" 2>&1
done_ "e2e wan-train" $?
# 6. qk_norm_rope_flux's backward without the split shares against its peers
timeout 200 python3 -m kgen bench qk_norm_rope_flux --backward --out "$R/suite" --build-dir /tmp/kb \
    > "$R/bench-qk_norm_rope_flux-backward.log" 2>&1
done_ "qk_norm_rope_flux backward" $?
touch "$R/JOB_DONE"
