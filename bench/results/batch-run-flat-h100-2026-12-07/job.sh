#!/usr/bin/env bash
# Steps 0 and 0b of job.sh in the least device time: main's and the patched tree's builds of the eight ops at once,
# both patches in one tree (they touch different families), one test run, then the variants; then step 0c.
set -u
R=${R:-/tmp/res}
mkdir -p "$R"
source scripts/device_env.sh "$R" > "$R/pip.log" 2>&1
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv > "$R/gpu.txt" 2>&1
done_() { echo "$1 rc=$2 $(date)" >> "$R/progress"; }
OPS="rope3d rope3d_qk qk_norm_rope3d rope_wan gelu_tanh silu_mul geglu silu_and_mul"
P=/tmp/tree-both
rm -rf $P && cp -r . $P && (cd $P && patch -p1 < bench/results/next/batch-run.patch && patch -p1 < bench/results/next/flat.patch) \
  > "$R/patch.log" 2>&1
python3 -m kgen build $OPS --arch sm_90 --compile --jobs 8 --out /tmp/kb > "$R/build.log" 2>&1 &
(cd $P && python3 -m kgen build $OPS --arch sm_90 --compile --jobs 8 --out /tmp/kbp) > "$R/build-both.log" 2>&1
wait
done_ builds $?
(cd $P && KGEN_TEST_BUILD_ROOT=/tmp/kbp PYTHONPATH=$P:/tmp/site timeout 300 python3 -m pytest -m gpu -q \
  -p no:cacheprovider tests/test_rotary_gpu.py tests/test_rotary_norm_gpu.py tests/test_ops_gpu.py tests/test_errors_gpu.py \
  tests/test_backward_gpu.py -k "rope3d or rope_wan or gelu or silu or geglu") > "$R/t-both.log" 2>&1
done_ "tests both" $?
timeout 120 python3 scripts/variants.py /tmp/kb /tmp/kbp rope3d rope3d_qk qk_norm_rope3d --forward \
  --case 16x64x2048 frames=1 height=8 width=8 --case 8x256x2048 frames=1 height=16 width=16 \
  --case 4x1024x2048 frames=4 height=16 width=16 > "$R/variants-run-few.md" 2>&1
done_ "variants batch run few" $?
timeout 150 python3 scripts/variants.py /tmp/kb /tmp/kbp gelu_tanh silu_mul geglu silu_and_mul > "$R/variants-flat.md" 2>&1
done_ "variants flat" $?
timeout 150 python3 scripts/variants.py /tmp/kb /tmp/kbp gelu_tanh silu_mul --case 1x197x3650 --case 1x5959x524 \
  --case 64x8960 --case 1x4608x12288 --case 1x32760x8960 --case 1x11672x12242 > "$R/variants-flat-more.md" 2>&1
done_ "variants flat more" $?
timeout 200 python3 scripts/variants.py /tmp/kb /tmp/kbp rope3d rope3d_qk qk_norm_rope3d --forward \
  > "$R/variants-run.md" 2>&1
done_ "variants batch run suite" $?
touch "$R/JOB_DONE"
