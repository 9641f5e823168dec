#!/usr/bin/env bash
# LTX-Video end to end with each variant's kernel table: where torch.compile + kgen's step goes at S = 8064
set -u
R=${R:-/tmp/res}
mkdir -p "$R"
source scripts/device_env.sh "$R" > "$R/pip.log" 2>&1
done_() { echo "$1 rc=$2 $(date)" >> "$R/progress"; }
python3 -m kgen build --all --arch sm_90 --compile --jobs 16 --out /tmp/kb > "$R/build.log" 2>&1
done_ build $?
timeout 480 python3 -m kgen bench --e2e ltx --profile --out "$R/e2e" --build-dir /tmp/kb > "$R/ltx.log" 2>&1
done_ "e2e ltx --profile" $?
touch "$R/JOB_DONE"
