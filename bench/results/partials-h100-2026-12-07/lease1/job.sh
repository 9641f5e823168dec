#!/usr/bin/env bash
# A lease: the weights' partial rows (partials.patch: the ordered column sums with 32 slices a block instead of 8,
# and the fused q/k norms' backward grid at the row reductions' partition instead of a wave) timed against main
# (variants, outputs compared bitwise), with its tests; LTX-Video's compiled training step with kgen serving every
# op or only the attentions and the GELU (ltx_split.py); then the step on the patched tree; on an H200 the suite.
# The tree sent is the patched one; main is rebuilt from it with the patch reversed. Writes to $R (default
# /tmp/res), touches $R/JOB_DONE.
set -u
R=${R:-/tmp/res}
mkdir -p "$R"
source scripts/device_env.sh "$R" > "$R/pip.log" 2>&1
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv > "$R/gpu.txt" 2>&1
done_() { echo "$1 rc=$2 $(date)" >> "$R/progress"; }
OPS="qk_norm_rope3d residual_adaln_rmsnorm adaln_rmsnorm residual_adaln_layernorm rmsnorm gelu_tanh qk_norm_rope_flux qk_norm_rope"
M=/tmp/tree-main
rm -rf $M && cp -r . $M && (cd $M && patch -R -p1 < bench/results/next/partials.patch) > "$R/patch.log" 2>&1
(cd $M && python3 -m kgen build $OPS --arch sm_90 --compile --jobs 16 --out /tmp/kb) > "$R/build-main.log" 2>&1
done_ "build main" $?
rm -rf /tmp/kbB && cp -r /tmp/kb /tmp/kbB
python3 -m kgen build $OPS --arch sm_90 --compile --jobs 16 --out /tmp/kbB > "$R/build-partials.log" 2>&1
done_ "build partials" $?
(cd $M && timeout 150 python3 scripts/variants.py /tmp/kb /tmp/kbB qk_norm_rope3d residual_adaln_rmsnorm \
  qk_norm_rope_flux qk_norm_rope rmsnorm) > "$R/variants.md" 2>&1
done_ "variants" $?
(cd $M && timeout 200 python3 bench/results/partials-h100-2026-12-07/ltx_split.py /tmp/kb "$R/ltx-split.json") > "$R/ltx-split.log" 2>&1
done_ "ltx split (main)" $?
KGEN_TEST_BUILD_ROOT=/tmp/kbB timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider \
  tests/test_rotary_norm_gpu.py > "$R/t-rotary-norm.log" 2>&1
done_ "tests rotary norm" $?
KGEN_TEST_BUILD_ROOT=/tmp/kbB timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_backward_gpu.py \
  -k "rmsnorm or adaln or layernorm" > "$R/t-backward.log" 2>&1
done_ "tests backward rows" $?
timeout 200 python3 -m kgen bench --e2e ltx-train --profile --out "$R/e2e-partials" --build-dir /tmp/kbB \
  > "$R/ltx-train-partials.log" 2>&1
done_ "e2e ltx-train partials" $?
# the counters of residual_adaln_rmsnorm's per-batch backward (67-74 % of a copy: what it waits on), main's build
STALLS="smsp__issue_active.avg.pct_of_peak_sustained_active
  smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio
  smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio
  smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio
  smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio
  smsp__average_warps_issue_stalled_wait_per_issue_active.ratio"
(cd $M && timeout 150 python3 scripts/ncu_counters.py residual_adaln_rmsnorm --backward --shapes "per batch" \
  --build-dir /tmp/kb --out "$R/ncu-radaln-bwd.md" --extra $STALLS) > "$R/ncu-radaln-bwd.log" 2>&1
done_ "ncu residual_adaln_rmsnorm backward" $?
# on an H200: issue 14's suite (forward: the patch changes no forward kernel)
if grep -q H200 "$R/gpu.txt"; then
  python3 -m kgen build --all --arch sm_90 --compile --jobs 16 --out /tmp/kbB > "$R/build-all.log" 2>&1
  done_ "build every op" $?
  timeout 420 python3 -m kgen bench --all --out "$R/suite-all" --build-dir /tmp/kbB > "$R/suite.log" 2>&1
  done_ suite $?
  python3 -m kgen report "$R/suite-all" > "$R/report.log" 2>&1
fi
touch "$R/JOB_DONE"
