#!/usr/bin/env bash
# The GPU work prepared for the next lease (README.md: why each step and what it predicts), steps in order of
# need: 1 three widened ladders of row kernels against main's (variants), 2 on an H200 the whole suite and the
# end-to-end tables (issue 14's one H200 run). About 5 minutes after start-up on an H100, 20 on an H200. Run from a
# tree of main; wheels the machine lacks (pydantic & co., kernels, tomlkit, liger-kernel, diffusers) in $WHEELS
# (default .whl/ of the tree). Writes to $R (default /tmp/res), touches $R/JOB_DONE.
set -u
R=${R:-/tmp/res}
mkdir -p "$R"
source scripts/device_env.sh "$R" > "$R/pip.log" 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv > "$R/gpu.txt" 2>&1
done_() { echo "$1 rc=$2 $(date)" >> "$R/progress"; }
ROWS="rmsnorm layernorm fused_add_rmsnorm adaln_rmsnorm adaln_layernorm residual_adaln_rmsnorm
  residual_adaln_layernorm adaln_layernorm_fp32 residual_adaln_layernorm_fp32 residual_layernorm_fp32"
python3 -m kgen build --all --arch sm_90 --compile --jobs 16 --out /tmp/kb > "$R/build.log" 2>&1
done_ build $?
# 1. the experiment trees: main with the ladder of threads per row widened three ways (widen.py), each's row
#    ops built and timed against main's build (forward; the backward kernels are column reductions: unchanged)
for v in one two flat; do
  rm -rf /tmp/widen-$v && cp -r . /tmp/widen-$v  # its kgen first on sys.path there (python -m puts the folder first)
  (cd /tmp/widen-$v && python3 bench/results/next/widen.py $v > "$R/widen-$v.log" 2>&1 && \
    python3 -m kgen build $ROWS --arch sm_90 --compile --jobs 16 --out /tmp/kbw-$v >> "$R/widen-$v.log" 2>&1)
  done_ "widened build $v" $?
  timeout 300 python3 scripts/variants.py /tmp/kb /tmp/kbw-$v $ROWS --forward > "$R/variants-$v.md" 2>&1
  done_ "variants $v" $?
done
# 2. on an H200 only: the whole suite and the end-to-end tables (issue 14's one H200 run)
if grep -q H200 "$R/gpu.txt"; then
  timeout 420 python3 -m kgen bench --all --out "$R/suite-all" --build-dir /tmp/kb > "$R/suite.log" 2>&1
  done_ suite $?
  python3 -m kgen report "$R/suite-all" > "$R/report.log" 2>&1
  timeout 480 python3 -m kgen bench --e2e qwen3 --graphs --out "$R/e2e" --build-dir /tmp/kb > "$R/qwen3.log" 2>&1
  done_ "e2e qwen3 --graphs" $?
  timeout 420 python3 -m kgen bench --e2e ltx --out "$R/e2e" --build-dir /tmp/kb > "$R/ltx.log" 2>&1
  done_ "e2e ltx" $?
fi
touch "$R/JOB_DONE"
