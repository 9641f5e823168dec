#!/usr/bin/env bash
# lease 2: the fixed expected-gradient helper: backward GPU tests of the rotary and elementwise ops.
set -u
export PYTHONUNBUFFERED=1
R=/tmp/res; W=/tmp/work
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $W/.whl/*.whl > $R/pip.log 2>&1
export PYTHONPATH=$W:/tmp/site
cd $W
OPS="rope rope_interleaved rope_apply rope3d rope3d_qk rope3d_coords rope_flux rope_wan geglu gelu_tanh silu_and_mul silu_mul qk_norm_rope_flux qk_norm_rope_wan"
python3 -m kgen build $OPS --arch sm_90 --compile --jobs 16 --out /tmp/b8 > $R/build.log 2>&1
echo "built $(date)" >> $R/progress
sed -i "s/^OPS = \[op for op in op_names() if /OPS = [op for op in op_names() if op in '$OPS'.split() and /" tests/test_backward_gpu.py
KGEN_TEST_BUILD_ROOT=/tmp/b8 timeout 300 python3 -m pytest tests/test_backward_gpu.py -m gpu -q -p no:cacheprovider > $R/t-backward.log 2>&1
echo "tests done $(date)" >> $R/progress
touch $R/JOB_DONE
