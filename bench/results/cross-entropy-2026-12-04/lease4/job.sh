#!/usr/bin/env bash
# lease 4 (short): main's head, every op built: the loss tests and the whole errors suite (its cross_entropy
# cases included), and the invariants.
set -u
export PYTHONUNBUFFERED=1
R=/tmp/res; W=/tmp/work
cd $W
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $W/.whl/*.whl > $R/pip.log 2>&1
export PYTHONPATH=$W:/tmp/site KGEN_TEST_BUILD_ROOT=/tmp/kb
python3 -m kgen build --all --arch sm_90 --compile --jobs 16 --out /tmp/kb > $R/build.log 2>&1
echo "built $(date)" >> $R/progress
timeout 200 python3 -m pytest -m gpu -p no:cacheprovider -q -rfEs tests/test_softmax_loss_gpu.py tests/test_errors_gpu.py tests/test_invariants_gpu.py > $R/t-suite.log 2>&1
echo "tests done $(date)" >> $R/progress
touch $R/JOB_DONE
