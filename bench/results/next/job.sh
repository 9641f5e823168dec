#!/usr/bin/env bash
# On an H200 (README.md: why each step and what it predicts): 1 the whole suite (issue 14's table), 2 LTX-Video
# and Qwen3-8B end to end, Qwen3 under CUDA graphs. About 16 minutes after start-up. Run from a tree of main;
# wheels the machine lacks (pydantic & co., kernels, tomlkit, liger-kernel, diffusers) in $WHEELS (default .whl/
# of the tree). Writes to $R (default /tmp/res), touches $R/JOB_DONE.
set -u
R=${R:-/tmp/res}
mkdir -p "$R"
source scripts/device_env.sh "$R" > "$R/pip.log" 2>&1
if ! grep -q H200 "$R/device.txt"; then echo "not an H200: nothing to do" >> "$R/progress"; touch "$R/JOB_DONE"; exit; fi
python3 -m kgen build --all --arch sm_90 --compile --jobs 16 --out /tmp/kb > "$R/build.log" 2>&1
done_ build $?
timeout 420 python3 -m kgen bench --all --out "$R/suite-all" --build-dir /tmp/kb > "$R/suite.log" 2>&1
done_ suite $?
python3 -m kgen report "$R/suite-all" > "$R/report.log" 2>&1
timeout 420 python3 -m kgen bench --e2e ltx --out "$R/e2e" --build-dir /tmp/kb > "$R/ltx.log" 2>&1
done_ "e2e ltx" $?
timeout 480 python3 -m kgen bench --e2e qwen3 --graphs --out "$R/e2e" --build-dir /tmp/kb > "$R/qwen3.log" 2>&1
done_ "e2e qwen3 --graphs" $?
touch "$R/JOB_DONE"
