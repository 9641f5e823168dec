#!/usr/bin/env bash
# Rows of 5120 16-bit elements (640 16-byte accesses) over 128 threads (5 accesses each) instead of the
# ladder's 256 (2.5: half the threads take 3): the 8-16 KB step of three Wan fp32 norms' forward set to 128
# threads by tuning entries (even-split.toml appended to arch/tuning/sm_90.toml in a copy of the tree), timed
# against main with scripts/variants.py. Writes to $R (default /tmp/res), touches $R/JOB_DONE.
set -u
R=${R:-/tmp/res}
mkdir -p "$R"
source scripts/device_env.sh "$R" > "$R/pip.log" 2>&1
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv > "$R/gpu.txt" 2>&1
done_() { echo "$1 rc=$2 $(date)" >> "$R/progress"; }
OPS="residual_layernorm_fp32 residual_adaln_layernorm_fp32 adaln_layernorm_fp32"
T=/tmp/tree-even
rm -rf $T && cp -r . $T && cat bench/results/even-split-h100-2026-12-07/even-split.toml >> $T/arch/tuning/sm_90.toml
(cd $T && python3 -m kgen build $OPS --arch sm_90 --compile --jobs 8 --out /tmp/kbE) > "$R/build-even.log" 2>&1 &
python3 -m kgen build $OPS --arch sm_90 --compile --jobs 8 --out /tmp/kbM > "$R/build.log" 2>&1
done_ build $?
wait
done_ "build even" 0
grep -h "rows <= 16384 B: 8 elem" /tmp/kbE/*/*/*.cu > "$R/plan-even.txt" 2>&1
timeout 150 python3 scripts/variants.py /tmp/kbM /tmp/kbE $OPS --forward > "$R/variants.md" 2>&1
done_ variants $?
touch "$R/JOB_DONE"
