#!/usr/bin/env bash
# A short lease: the fused q/k norms' backward with two wide heads loaded before the first head's math
# (wide-prefetch.patch, against main: LTX-Video's q and k, a 256-thread block each); its tests, its timing, its
# counters and LTX-Video's training step with and without it; Wan's fused q/k norm's DRAM bytes now that main
# rotates one tensor at a time; then on an H200 only the suite and LTX-Video. Run from a tree of main with the
# wheels in $WHEELS (default .whl/); writes to $R (default /tmp/res), touches $R/JOB_DONE.
set -u
R=${R:-/tmp/res}
mkdir -p "$R"
source scripts/device_env.sh "$R" > "$R/pip.log" 2>&1
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv > "$R/gpu.txt" 2>&1
done_() { echo "$1 rc=$2 $(date)" >> "$R/progress"; }
python3 -m kgen build --all --arch sm_90 --compile --jobs 16 --out /tmp/kb > "$R/build.log" 2>&1
done_ build $?
# the patched tree's fused q/k norms beside main's builds (a build directory holds both: each tree loads its own)
P=/tmp/tree-wide
rm -rf $P && cp -r . $P && (cd $P && patch -p1 < bench/results/next/wide-prefetch.patch) > "$R/patch.log" 2>&1
rm -rf /tmp/kbw && cp -r /tmp/kb /tmp/kbw
(cd $P && python3 -m kgen build qk_norm_rope3d qk_norm_rope_flux qk_norm_rope qk_norm_rope_wan --arch sm_90 \
  --compile --jobs 16 --out /tmp/kbw) > "$R/build-wide.log" 2>&1
done_ "build wide" $?
timeout 200 python3 scripts/variants.py /tmp/kb /tmp/kbw qk_norm_rope3d qk_norm_rope_wan qk_norm_rope_flux \
  > "$R/variants-wide.md" 2>&1
done_ "variants wide" $?
(cd $P && KGEN_TEST_BUILD_ROOT=/tmp/kbw PYTHONPATH=$P:/tmp/site timeout 240 python3 -m pytest -m gpu -q \
  -p no:cacheprovider tests/test_rotary_norm_gpu.py) > "$R/t-wide.log" 2>&1
done_ "tests rotary norm (wide)" $?
STALLS="smsp__issue_active.avg.pct_of_peak_sustained_active
  smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio
  smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio
  smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio"
(cd $P && timeout 120 python3 scripts/ncu_counters.py qk_norm_rope3d --backward --build-dir /tmp/kbw \
  --out "$R/ncu-rope3d-bwd-wide.md" --extra $STALLS) > "$R/ncu-rope3d-bwd-wide.log" 2>&1
done_ "ncu qk_norm_rope3d backward (wide)" $?
# Wan's fused q/k norm as main now builds it (one tensor's heads at a time): the DRAM read against the bytes
# counted (2.0x before: bench/results/flat-qk-counters-h100-2026-12-07/ncu-qk.md)
timeout 120 python3 scripts/ncu_counters.py qk_norm_rope_wan --backward --build-dir /tmp/kb --out "$R/ncu-wan.md" \
  > "$R/ncu-wan.log" 2>&1
done_ "ncu wan" $?
# LTX-Video's training step: main, then the patched tree (issue 13: torch.compile + kgen >= 1.03x)
timeout 240 python3 -m kgen bench --e2e ltx-train --profile --out "$R/e2e-main" --build-dir /tmp/kb \
  > "$R/ltx-train-main.log" 2>&1
done_ "e2e ltx-train main" $?
(cd $P && timeout 240 python3 -m kgen bench --e2e ltx-train --profile --out "$R/e2e-wide" --build-dir /tmp/kbw) \
  > "$R/ltx-train-wide.log" 2>&1
done_ "e2e ltx-train wide" $?
H200=0; grep -q H200 "$R/gpu.txt" && H200=1
if [ $H200 = 1 ]; then
  timeout 420 python3 -m kgen bench --all --out "$R/suite-all" --build-dir /tmp/kb > "$R/suite.log" 2>&1
  done_ suite $?
  python3 -m kgen report "$R/suite-all" > "$R/report.log" 2>&1
  timeout 420 python3 -m kgen bench --e2e ltx --out "$R/e2e" --build-dir /tmp/kb > "$R/ltx.log" 2>&1
  done_ "e2e ltx" $?
fi
touch "$R/JOB_DONE"
