#!/usr/bin/env bash
# lease 3: the per-token shift test as landed; LTX-Video's training step with kernel tables; its copies.
set -u
export PYTHONUNBUFFERED=1
R=/tmp/res; W=/tmp/work
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $W/.whl/*.whl > $R/pip.log 2>&1
export PYTHONPATH=$W:/tmp/site
cd $W
OPS="adaln_rmsnorm adaln_layernorm residual_adaln_rmsnorm residual_adaln_layernorm"
python3 -m kgen build $OPS --arch sm_90 --compile --jobs 16 --out /tmp/b4 > $R/build.log 2>&1
sed -i "s/^OPS = \[op for op in op_names() if /OPS = [op for op in op_names() if op in '$OPS'.split() and /" tests/test_backward_gpu.py
KGEN_TEST_BUILD_ROOT=/tmp/b4 timeout 200 python3 -m pytest tests/test_backward_gpu.py -m gpu -q -p no:cacheprovider -k "per_token_shift or gradients_match or opcheck or compiled" > $R/t-backward.log 2>&1
echo "tests done $(date)" >> $R/progress
timeout 420 python3 -m kgen bench --e2e ltx-train --profile --out $R/e2e --build-dir /tmp/b-ltx > $R/e2e-ltx-train.log 2>&1
echo "e2e done $(date)" >> $R/progress
timeout 300 python3 $W/bench/results/e2e-ltx-train-2026-12-03/copies_probe.py ltx-train /tmp/b-ltx > $R/copies-ltx.log 2>&1
echo "probe done $(date)" >> $R/progress
touch $R/JOB_DONE
