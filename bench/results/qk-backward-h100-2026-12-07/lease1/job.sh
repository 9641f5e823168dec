#!/usr/bin/env bash
# A short lease: Wan's q/k norm with each tensor's heads summed and rotated in turn, the head read last rotated
# first (wan-order.patch, against main); the fused q/k norms' backward with a head's two sums in one pass
# (head-pair.patch); qk_norm_rope3d's backward under ncu; then on an H200 only the suite and LTX-Video. Run
# from a tree of main with the wheels in $WHEELS (default .whl/); writes to $R (default /tmp/res), touches
# $R/JOB_DONE.
set -u
R=${R:-/tmp/res}
mkdir -p "$R"
source scripts/device_env.sh "$R" > "$R/pip.log" 2>&1
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv > "$R/gpu.txt" 2>&1
done_() { echo "$1 rc=$2 $(date)" >> "$R/progress"; }
# main's builds of what the fused q/k norms' tests load (the base), the patched tree's Wan op beside them
NORM_OPS="qk_norm_rope_flux qk_norm_rope_wan qk_norm_rope qk_norm_rope3d rope_flux rope_wan rope rope3d_qk rmsnorm"
python3 -m kgen build $NORM_OPS --arch sm_90 --compile --jobs 16 --out /tmp/kb > "$R/build.log" 2>&1
done_ build $?
E=/tmp/tree-wan
rm -rf $E && cp -r . $E && (cd $E && patch -p1 < bench/results/next/wan-order.patch) > "$R/patch.log" 2>&1
rm -rf /tmp/kbe && cp -r /tmp/kb /tmp/kbe
(cd $E && python3 -m kgen build qk_norm_rope_wan --arch sm_90 --compile --out /tmp/kbe) > "$R/build-wan.log" 2>&1
timeout 150 python3 scripts/variants.py /tmp/kb /tmp/kbe qk_norm_rope_wan > "$R/variants-wan.md" 2>&1
done_ "variants wan" $?
for side in kb kbe; do
  timeout 100 python3 scripts/ncu_counters.py qk_norm_rope_wan --build-dir /tmp/$side --out "$R/ncu-wan-$side.md" \
    > "$R/ncu-wan-$side.log" 2>&1
done
done_ "ncu wan" $?
# the fused q/k norms' tests (their hypothesis cases draw the op) on the patched build
(cd $E && KGEN_TEST_BUILD_ROOT=/tmp/kbe PYTHONPATH=$E:/tmp/site timeout 240 python3 -m pytest -m gpu -q \
  -p no:cacheprovider tests/test_rotary_norm_gpu.py) > "$R/t-wan.log" 2>&1
done_ "tests rotary norm" $?
# the fused q/k norms' backward with a head's two sums in one pass (head-pair.patch): tests, then against main
P=/tmp/tree-pair
rm -rf $P && cp -r . $P && (cd $P && patch -p1 < bench/results/next/head-pair.patch) > "$R/patch-pair.log" 2>&1
rm -rf /tmp/kbh && cp -r /tmp/kb /tmp/kbh
(cd $P && python3 -m kgen build qk_norm_rope3d qk_norm_rope_flux qk_norm_rope --arch sm_90 --compile --jobs 16 \
  --out /tmp/kbh) > "$R/build-pair.log" 2>&1
(cd $P && KGEN_TEST_BUILD_ROOT=/tmp/kbh PYTHONPATH=$P:/tmp/site timeout 240 python3 -m pytest -m gpu -q \
  -p no:cacheprovider tests/test_rotary_norm_gpu.py) > "$R/t-pair.log" 2>&1
done_ "tests head pair" $?
timeout 200 python3 scripts/variants.py /tmp/kb /tmp/kbh qk_norm_rope3d qk_norm_rope_flux qk_norm_rope \
  > "$R/variants-pair.md" 2>&1
done_ "variants head pair" $?
# issue 13: qk_norm_rope3d's backward (the costliest kgen kernel of LTX-Video's compiled training step, ~38 % of
# a copy on the H100) beside its forward: DRAM bytes against the bytes counted, issue use, where warps wait
timeout 120 python3 scripts/ncu_counters.py qk_norm_rope3d --backward --build-dir /tmp/kb --out "$R/ncu-rope3d-bwd.md" \
  --extra smsp__issue_active.avg.pct_of_peak_sustained_active \
  smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio \
  smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio \
  smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio > "$R/ncu-rope3d-bwd.log" 2>&1
done_ "ncu qk_norm_rope3d backward" $?
H200=0; grep -q H200 "$R/gpu.txt" && H200=1
if [ $H200 = 1 ]; then
  python3 -m kgen build --all --arch sm_90 --compile --jobs 16 --out /tmp/kb > "$R/build-all.log" 2>&1
  timeout 420 python3 -m kgen bench --all --out "$R/suite-all" --build-dir /tmp/kb > "$R/suite.log" 2>&1
  done_ suite $?
  python3 -m kgen report "$R/suite-all" > "$R/report.log" 2>&1
  timeout 420 python3 -m kgen bench --e2e ltx --out "$R/e2e" --build-dir /tmp/kb > "$R/ltx.log" 2>&1
  done_ "e2e ltx" $?
fi
touch "$R/JOB_DONE"
