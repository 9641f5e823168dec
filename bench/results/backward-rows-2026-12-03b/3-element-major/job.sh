#!/usr/bin/env bash
# lease 3: element-major partial rows: backward GPU tests of the row ops, then the breakdown
set -u
export PYTHONUNBUFFERED=1
R=/tmp/res; W=/tmp/work
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $W/.whl/*.whl > $R/pip.log 2>&1
export PYTHONPATH=/tmp/site
OPS="rmsnorm layernorm fused_add_rmsnorm adaln_rmsnorm residual_adaln_rmsnorm residual_adaln_layernorm adaln_layernorm adaln_layernorm_fp32 residual_adaln_layernorm_fp32 residual_layernorm_fp32"
mkdir -p /tmp/v/f2 && tar xzf $W/.gpu/v-final2.tgz -C /tmp/v/f2 && cd /tmp/v/f2
sed -i "s/^OPS = \[op for op in op_names() if /OPS = [op for op in op_names() if op in '$OPS'.split() and /" tests/test_backward_gpu.py
grep -n "^OPS = " tests/test_backward_gpu.py > $R/ops-line.txt
PYTHONPATH=/tmp/v/f2:/tmp/site python3 -m kgen build $OPS --arch sm_90 --compile --jobs 16 --out /tmp/kgen-build > $R/build.log 2>&1
echo "builds done $(date)" >> $R/progress
KGEN_TEST_BUILD_ROOT=/tmp/kgen-build PYTHONPATH=/tmp/v/f2:/tmp/site timeout 200 python3 -m pytest tests/test_backward_gpu.py -m gpu -q -p no:cacheprovider > $R/t-backward.log 2>&1
echo "tests done $(date)" >> $R/progress
BD=$W/bench/results/backward-kernels-2026-12-03/breakdown.py
PYTHONPATH=/tmp/v/f2:/tmp/site python3 $BD /tmp/kgen-build rmsnorm,layernorm,adaln_rmsnorm,residual_adaln_layernorm --tag final2 > $R/breakdown-final2.jsonl 2> $R/breakdown-final2.err
echo "breakdown done $(date)" >> $R/progress
touch $R/JOB_DONE
