#!/usr/bin/env bash
# The second lease: the wide head's sum between two barriers from one buffer (64 registers at the profile's 4
# resident blocks, no spills) against one barrier over two alternating buffers at 3 blocks (80 registers: the
# first lease's build; one-barrier.patch), the rotary-norm tests again (a [B, S, C] test's inputs fixed), the
# op against the two it replaces, and Nsight Compute's counters for it and rope3d_qk (why 50 % of copy).
# Predicted: 1.10-1.16x (the first lease's 4-block build, which spilled 24 bytes, ran 1.16x). About 6 minutes
# after start-up.
set -u
R=${R:-/tmp/res}
D=bench/results/qk-norm-rope3d-2026-12-06
mkdir -p "$R"
source scripts/device_env.sh "$R" > "$R/pip.log" 2>&1
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv > "$R/gpu.txt" 2>&1
done_() { echo "$1 rc=$2 $(date)" >> "$R/progress"; }
export KGEN_TEST_BUILD_ROOT=/tmp/kb
python3 -m kgen build --all --arch sm_90 --compile --jobs 16 --out /tmp/kb > "$R/build.log" 2>&1
done_ build $?
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_rotary_norm_gpu.py \
  > "$R/t-rotary-norm.log" 2>&1
done_ "tests rotary norm" $?
rm -rf /tmp/tree1 && cp -r . /tmp/tree1 && (cd /tmp/tree1 && patch -p1 < $D/one-barrier.patch) > "$R/patch.log" 2>&1
(cd /tmp/tree1 && python3 -m kgen build qk_norm_rope3d --arch sm_90 --compile --out /tmp/kb1) > "$R/build1.log" 2>&1
timeout 150 python3 scripts/variants.py /tmp/kb1 /tmp/kb qk_norm_rope3d --forward > "$R/variants.md" 2>&1
done_ "variants one barrier (base) against two" $?
timeout 120 python3 $D/compare.py /tmp/kb > "$R/compare.md" 2> "$R/compare.err"
done_ compare $?
timeout 240 python3 scripts/ncu_counters.py qk_norm_rope3d rope3d_qk --build-dir /tmp/kb --out "$R/ncu.md" \
  > "$R/ncu.log" 2>&1
done_ ncu $?
touch "$R/JOB_DONE"
