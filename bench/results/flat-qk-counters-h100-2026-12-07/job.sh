#!/usr/bin/env bash
# The GPU work prepared for the next lease (README.md: why each step and what it predicts), in order of need:
# 0 dense elementwise tensors as one row in one launch (a patch, against main) and the generated projects' NaN
# tests, 1 on an H200 only: the whole suite (issue 14's table), 2 counters of the q/k norm + rotation kernels,
# 3 LTX-Video's training step under the profiler (where the compiled step still loses to its 1.03x goal), 4 on
# an H200 only: LTX-Video and Qwen3-8B under CUDA graphs. About 9 minutes after start-up on an H100, 26 on an
# H200. Run from a tree of main; wheels the machine lacks (pydantic & co., kernels, tomlkit, liger-kernel,
# diffusers) in $WHEELS (default .whl/ of the tree). Writes to $R (default /tmp/res), touches $R/JOB_DONE.
set -u
R=${R:-/tmp/res}
mkdir -p "$R"
source scripts/device_env.sh "$R" > "$R/pip.log" 2>&1
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv > "$R/gpu.txt" 2>&1
done_() { echo "$1 rc=$2 $(date)" >> "$R/progress"; }
# every op: the tests build what they touch from this root (a root of a few ops made the rotary tests build the
# rest on demand and run past their limit: bench/results/batch-run-flat-h100-2026-12-07)
python3 -m kgen build --all --arch sm_90 --compile --jobs 16 --out /tmp/kb > "$R/build.log" 2>&1
done_ build $?
# 0. dense elementwise tensors as one row in one launch (flat.patch): the patched tree's elementwise GPU tests,
#    then its builds against main's at the suite's shapes and at odd and model shapes outside it
E=/tmp/tree-flat
rm -rf $E && cp -r . $E && (cd $E && patch -p1 < bench/results/next/flat.patch) > "$R/patch-flat.log" 2>&1
rm -rf /tmp/kbe && cp -r /tmp/kb /tmp/kbe
(cd $E && python3 -m kgen build gelu_tanh silu_mul geglu silu_and_mul --arch sm_90 --compile --out /tmp/kbe) \
  > "$R/build-flat.log" 2>&1
(cd $E && KGEN_TEST_BUILD_ROOT=/tmp/kbe PYTHONPATH=$E:/tmp/site timeout 420 python3 -m pytest -m gpu -q \
  -p no:cacheprovider tests/test_ops_gpu.py tests/test_errors_gpu.py tests/test_backward_gpu.py \
  -k "gelu or silu or geglu") > "$R/t-flat.log" 2>&1
done_ "tests flat" $?
# 0b. each generated project's own test of NaN and ±inf in the lead input (what a user of a published kernel
#     runs), main's builds, one process
(cd /tmp/kb && timeout 240 python3 -m pytest -q -p no:cacheprovider */tests -k nan_and_infinity) \
  > "$R/t-project-nan.log" 2>&1
done_ "project nan tests" $?
timeout 240 python3 scripts/variants.py /tmp/kb /tmp/kbe gelu_tanh silu_mul geglu silu_and_mul > "$R/variants-flat.md" 2>&1
timeout 150 python3 scripts/variants.py /tmp/kb /tmp/kbe gelu_tanh silu_mul --case 1x197x3650 --case 1x5959x524 \
  --case 64x8960 --case 1x4608x12288 --case 1x32760x8960 --case 1x11672x12242 > "$R/variants-flat-more.md" 2>&1
done_ "variants flat" $?
# 1. on an H200 only: the whole suite (issue 14's table)
H200=0; grep -q H200 "$R/gpu.txt" && H200=1
if [ $H200 = 1 ]; then
  timeout 420 python3 -m kgen bench --all --out "$R/suite-all" --build-dir /tmp/kb > "$R/suite.log" 2>&1
  done_ suite $?
  python3 -m kgen report "$R/suite-all" > "$R/report.log" 2>&1
fi
# 2. counters of the q/k norm + rotation kernels (46-71 % of copy; rope_wan alone 85-91 %): DRAM bytes against the
#    bytes counted (a Wan token's heads read twice: is the second read served by L2?), occupancy, instructions,
#    what the float64 angles cost (float64 instructions, the SM's busiest unit, issue slots used) and where warps
#    wait (on memory, on shuffles and the special-function unit, on a busy math pipe); if ncu refuses one of
#    these metrics, the run again without them
QK="qk_norm_rope_wan qk_norm_rope_flux qk_norm_rope3d rope_wan"
EXTRA="sm__throughput.avg.pct_of_peak_sustained_elapsed smsp__issue_active.avg.pct_of_peak_sustained_active
  smsp__sass_thread_inst_executed_op_dfma_pred_on.sum smsp__sass_thread_inst_executed_op_dmul_pred_on.sum
  smsp__sass_thread_inst_executed_op_dadd_pred_on.sum
  smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio
  smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio
  smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio"
timeout 240 python3 scripts/ncu_counters.py $QK --build-dir /tmp/kb --out "$R/ncu-qk.md" --extra $EXTRA \
  > "$R/ncu-qk.log" 2>&1 || timeout 200 python3 scripts/ncu_counters.py $QK --build-dir /tmp/kb \
  --out "$R/ncu-qk.md" > "$R/ncu-qk-plain.log" 2>&1
done_ "ncu qk norm rope" $?
# 3. LTX-Video's training step with each variant's kernel table (GPU idle time: host-bound or not)
timeout 360 python3 -m kgen bench --e2e ltx-train --profile --out "$R/e2e" --build-dir /tmp/kb > "$R/ltx-train.log" 2>&1
done_ "e2e ltx-train --profile" $?
# 4. on an H200 only: LTX-Video and Qwen3-8B under CUDA graphs (issue 14's e2e tables)
if [ $H200 = 1 ]; then
  timeout 420 python3 -m kgen bench --e2e ltx --out "$R/e2e" --build-dir /tmp/kb > "$R/ltx.log" 2>&1
  done_ "e2e ltx" $?
  timeout 480 python3 -m kgen bench --e2e qwen3 --graphs --out "$R/e2e" --build-dir /tmp/kb > "$R/qwen3.log" 2>&1
  done_ "e2e qwen3 --graphs" $?
fi
touch "$R/JOB_DONE"
