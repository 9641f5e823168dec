#!/usr/bin/env bash
# A short lease on main after the fused q/k norms' three changes (Wan's order, a head's two backward sums in one
# pass, two wide heads in flight in the backward): LTX-Video's training step twice (issue 13's torch.compile +
# kgen >= 1.03x, 1.027 and 1.033 in the last two runs), then the backward of each op that step runs timed
# against eager autograd and torch.compile (`kgen bench OP --backward`: issue 13's per-op bars), then on an H200
# only the suite. Run from a tree of main with the wheels in $WHEELS (default .whl/); writes to $R (default
# /tmp/res), touches $R/JOB_DONE.
set -u
R=${R:-/tmp/res}
mkdir -p "$R"
source scripts/device_env.sh "$R" > "$R/pip.log" 2>&1
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv > "$R/gpu.txt" 2>&1
done_() { echo "$1 rc=$2 $(date)" >> "$R/progress"; }
python3 -m kgen build --all --arch sm_90 --compile --jobs 16 --out /tmp/kb > "$R/build.log" 2>&1
done_ build $?
timeout 200 python3 -m kgen bench --e2e ltx-train --profile --out "$R/e2e-a" --build-dir /tmp/kb > "$R/ltx-train-a.log" 2>&1
done_ "e2e ltx-train (a, profiled)" $?
for op in qk_norm_rope3d residual_adaln_rmsnorm; do
  timeout 150 python3 -m kgen bench "$op" --backward --out "$R/backward" --build-dir /tmp/kb > "$R/backward-$op.log" 2>&1
  done_ "backward $op" $?
done
timeout 200 python3 -m kgen bench --e2e ltx-train --out "$R/e2e-b" --build-dir /tmp/kb > "$R/ltx-train-b.log" 2>&1
done_ "e2e ltx-train (b)" $?
for op in gelu_tanh rmsnorm; do
  timeout 100 python3 -m kgen bench "$op" --backward --out "$R/backward" --build-dir /tmp/kb > "$R/backward-$op.log" 2>&1
  done_ "backward $op" $?
done
H200=0; grep -q H200 "$R/gpu.txt" && H200=1
if [ $H200 = 1 ]; then
  timeout 420 python3 -m kgen bench --all --out "$R/suite-all" --build-dir /tmp/kb > "$R/suite.log" 2>&1
  done_ suite $?
  python3 -m kgen report "$R/suite-all" > "$R/report.log" 2>&1
fi
touch "$R/JOB_DONE"
