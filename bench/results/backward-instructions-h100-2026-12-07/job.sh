#!/usr/bin/env bash
# Ran on 2026-12-07 from main with both patches applied (this folder: bench/results/next/backward-instructions/).
# Two kernel changes against main in one lease (../README.md: what each predicts): this tree has both; with
# row-positions.patch reversed it is branch element-words (bfloat16 elements read from their words), with
# element-words.patch reversed too it is main. The ops each change touches are built from each tree (/tmp/kb0
# main, /tmp/kb1 element-words, /tmp/kb2 this tree, every op); scripts/variants.py times each op's forward and
# derived backward at every suite shape, two builds interleaved, outputs compared bitwise: main against
# element-words (variants-words.md), element-words against this tree (variants-positions.md), after the GPU
# tests of the forward and backward kernels on this tree's build (TT, VT, VP: time limits). About 11 minutes;
# LEAN=1: four ops at their largest shape. Writes to $R (default /tmp/res), touches $R/JOB_DONE.
set -u
R=${R:-/tmp/res}
HERE=bench/results/next/backward-instructions
mkdir -p "$R"
source scripts/device_env.sh "$R" > "$R/pip.log" 2>&1
SITE=${PYTHONPATH#*:}
WORDS="residual_adaln_rmsnorm rmsnorm fused_add_rmsnorm adaln_rmsnorm layernorm residual_adaln_layernorm geglu
  gelu_tanh silu_and_mul cross_entropy"
POSITIONS="residual_adaln_rmsnorm rmsnorm fused_add_rmsnorm adaln_rmsnorm layernorm residual_adaln_layernorm"
LARGEST=""
if [ "${LEAN:-0}" = 1 ]; then
  WORDS="residual_adaln_rmsnorm rmsnorm fused_add_rmsnorm gelu_tanh"
  POSITIONS="residual_adaln_rmsnorm rmsnorm"
  LARGEST=--largest
fi
rm -rf /tmp/t1 /tmp/t0 && cp -r . /tmp/t1 && (cd /tmp/t1 && patch -s -R -p1 < "$HERE/row-positions.patch") \
  && cp -r /tmp/t1 /tmp/t0 && (cd /tmp/t0 && patch -s -R -p1 < "$HERE/element-words.patch")
done_ "trees" $?
for n in 0 1; do
  (cd /tmp/t$n && PYTHONPATH=/tmp/t$n:$SITE python3 -m kgen build $WORDS --arch sm_90 --compile --jobs 16 \
    --out /tmp/kb$n > "$R/build-$n.log" 2>&1)
  done_ "build $n" $?
done
python3 -m kgen build --all --arch sm_90 --compile --jobs 16 --out /tmp/kb2 > "$R/build-2.log" 2>&1
done_ "build 2" $?
KGEN_TEST_BUILD_ROOT=/tmp/kb2 timeout "${TT:-200}" python3 -m pytest tests/test_ops_gpu.py tests/test_backward_gpu.py \
  tests/test_rmsnorm_gpu.py tests/test_softmax_loss_gpu.py -m gpu -p no:cacheprovider -q -x > "$R/gpu-tests.log" 2>&1
done_ "gpu tests" $?
tail -3 "$R/gpu-tests.log" >> "$R/progress"
timeout "${VT:-200}" python3 scripts/variants.py /tmp/kb0 /tmp/kb1 $WORDS $LARGEST > "$R/variants-words.md" \
  2> "$R/variants-words.err"
done_ "variants words" $?
timeout "${VP:-120}" python3 scripts/variants.py /tmp/kb1 /tmp/kb2 $POSITIONS $LARGEST > "$R/variants-positions.md" \
  2> "$R/variants-positions.err"
done_ "variants positions" $?
touch "$R/JOB_DONE"
