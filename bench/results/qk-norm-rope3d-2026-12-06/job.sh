#!/usr/bin/env bash
# qk_norm_rope3d (LTX-Video's self-attention q/k norms across heads and rope3d in one pass; a head's sum across
# the warps of a block) on the GPU: 1 the rotary-norm tests (every q/k norm op, head sizes now up to a block's
# lanes), the rotary error tests and the diffusers integration; 2 the op against rmsnorm ×2 + rope3d_qk and
# diffusers' eager steps (compare.py), its wide-head kernel with 1 and 4 resident blocks asked against the
# profile's 3 (scripts/variants.py), and kgen bench of the q/k norm ops; 3 LTX-Video end to end. Predicted
# (README.md): forward 1.6-1.9x faster than the two ops it replaces at S = 8064 (264 MB moved instead of 528),
# LTX-Video under torch.compile 1.03-1.04x. About 12 minutes after start-up. Run from a tree of main; wheels
# in $WHEELS (default .whl/). Writes to $R (default /tmp/res), touches $R/JOB_DONE.
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
# 1. tests
timeout 360 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_rotary_norm_gpu.py \
  > "$R/t-rotary-norm.log" 2>&1
done_ "tests rotary norm" $?
timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_errors_gpu.py tests/test_rotary_gpu.py \
  tests/test_backward_gpu.py -k "qk_norm or rope3d" > "$R/t-rotary.log" 2>&1
done_ "tests rotary errors" $?
timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_diffusers_integration.py \
  > "$R/t-diffusers.log" 2>&1
done_ "tests diffusers" $?
# 2. the op
timeout 180 python3 $D/compare.py /tmp/kb > "$R/compare.md" 2> "$R/compare.err"
done_ compare $?
# the resident blocks asked of a wide head's kernel: 1 (none: 89 registers, 2 blocks) and 4 (64, 24 bytes
# spilled) against the profile's 3 (80 registers), built from copies of the tree with the profile changed
for n in 1 4; do
  rm -rf /tmp/tree$n && cp -r . /tmp/tree$n
  sed -i "s/^wide_head_blocks_per_sm = 3 /wide_head_blocks_per_sm = $n /" /tmp/tree$n/arch/sm_90.toml
  (cd /tmp/tree$n && python3 -m kgen build qk_norm_rope3d --arch sm_90 --compile --out /tmp/kb$n) \
    > "$R/build$n.log" 2>&1
  timeout 150 python3 scripts/variants.py /tmp/kb /tmp/kb$n qk_norm_rope3d --forward > "$R/variants$n.md" 2>&1
  done_ "variants wide blocks $n" $?
done
for op in qk_norm_rope3d qk_norm_rope_flux qk_norm_rope; do
  timeout 120 python3 -m kgen bench $op --out "$R/ops" --build-dir /tmp/kb > "$R/bench-$op.log" 2>&1
  done_ "bench $op" $?
done
timeout 150 python3 -m kgen bench qk_norm_rope3d --backward --out "$R/ops" --build-dir /tmp/kb \
  > "$R/bench-qk_norm_rope3d-backward.log" 2>&1
done_ "bench qk_norm_rope3d --backward" $?
# 3. LTX-Video end to end
timeout 420 python3 -m kgen bench --e2e ltx --out "$R/e2e" --build-dir /tmp/kb > "$R/ltx.log" 2>&1
done_ "e2e ltx" $?
touch "$R/JOB_DONE"
