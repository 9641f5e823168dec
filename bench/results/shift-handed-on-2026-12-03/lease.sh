#!/usr/bin/env bash
# lease 2: AdaLN's shift gradient handed on per token: before/after builds of the four ops it touches, their
# backward GPU tests, breakdowns; then where torch.compile + kgen's Qwen3 step copies.
set -u
export PYTHONUNBUFFERED=1
R=/tmp/res; W=/tmp/work
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $W/.whl/*.whl > $R/pip.log 2>&1
export PYTHONPATH=/tmp/site
OPS="adaln_rmsnorm adaln_layernorm residual_adaln_rmsnorm residual_adaln_layernorm"
for v in before after; do mkdir -p /tmp/v/$v && tar xzf $W/.gpu/v-$v.tgz -C /tmp/v/$v; done
(cd /tmp/v/before && PYTHONPATH=/tmp/v/before:/tmp/site python3 -m kgen build $OPS --arch sm_90 --compile --jobs 6 --out /tmp/build-before > $R/build-before.log 2>&1) &
(cd /tmp/v/after && PYTHONPATH=/tmp/v/after:/tmp/site python3 -m kgen build $OPS --arch sm_90 --compile --jobs 10 --out /tmp/build-after > $R/build-after.log 2>&1) &
wait
echo "builds done $(date)" >> $R/progress
cd /tmp/v/after
sed -i "s/^OPS = \[op for op in op_names() if /OPS = [op for op in op_names() if op in '$OPS'.split() and /" tests/test_backward_gpu.py
KGEN_TEST_BUILD_ROOT=/tmp/build-after PYTHONPATH=/tmp/v/after:/tmp/site timeout 300 python3 -m pytest tests/test_backward_gpu.py -m gpu -q -p no:cacheprovider > $R/t-backward.log 2>&1
echo "tests done $(date)" >> $R/progress
BD=$W/bench/results/backward-kernels-2026-12-03/breakdown.py
CS="adaln_rmsnorm:2x8064x2048,residual_adaln_layernorm:2x8064x2048,residual_adaln_rmsnorm:2x8064x2048,adaln_layernorm:1x4608x3072"
for v in before after; do
  extra=""; [ $v = after ] && extra="--compile-shapes $CS"
  (cd /tmp/v/$v && PYTHONPATH=/tmp/v/$v:/tmp/site python3 $BD /tmp/build-$v ${OPS// /,} --tag $v $extra > "$R/breakdown-$v.jsonl" 2> "$R/breakdown-$v.err")
done
python3 $W/bench/results/backward-kernels-2026-12-03/table.py "$R/breakdown-before.jsonl" "$R/breakdown-after.jsonl" > "$R/table.md"
echo "breakdown done $(date)" >> $R/progress
(cd /tmp/v/after && PYTHONPATH=/tmp/v/after:/tmp/site timeout 420 python3 $W/bench/results/e2e-ltx-train-2026-12-03/copies_probe.py qwen3-train /tmp/build-q > $R/copies.log 2>&1)
echo "probe done $(date)" >> $R/progress
touch $R/JOB_DONE
