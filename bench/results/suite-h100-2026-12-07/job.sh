#!/usr/bin/env bash
# main as it stands: the whole suite (`kgen bench --all`) and its report; on an H200 also `--e2e ltx` (job.sh's
# first two steps; its Qwen3 step is left for a longer lease). Writes to $R (default /tmp/res), touches
# $R/JOB_DONE.
set -u
R=${R:-/tmp/res}
mkdir -p "$R"
source scripts/device_env.sh "$R" > "$R/pip.log" 2>&1
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv > "$R/gpu.txt" 2>&1
done_() { echo "$1 rc=$2 $(date)" >> "$R/progress"; }
python3 -m kgen build --all --arch sm_90 --compile --jobs 16 --out /tmp/kb > "$R/build.log" 2>&1
done_ build $?
timeout 400 python3 -m kgen bench --all --out "$R/suite-all" --build-dir /tmp/kb > "$R/suite.log" 2>&1
done_ suite $?
python3 -m kgen report "$R/suite-all" > "$R/report.log" 2>&1
done_ report $?
if grep -q H200 "$R/gpu.txt"; then
  timeout 420 python3 -m kgen bench --e2e ltx --out "$R/e2e" --build-dir /tmp/kb > "$R/ltx.log" 2>&1
  done_ "e2e ltx" $?
fi
touch "$R/JOB_DONE"
