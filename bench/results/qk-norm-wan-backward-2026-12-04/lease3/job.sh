#!/usr/bin/env bash
# lease 3: the held kernel's converted values not kept across the token's sums (opaque): the rotary norm tests
# and qk_norm_rope_wan's backward benchmark on the final code.
set -u
export PYTHONUNBUFFERED=1
R=/tmp/res; W=/tmp/work
cd $W
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $W/.whl/*.whl > $R/pip.log 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $R/device.txt 2>&1
export PYTHONPATH=$W:/tmp/site
python3 -m kgen build --all --arch sm_90 --compile --jobs 16 --out /tmp/kb > $R/build.log 2>&1
echo "built $(date)" >> $R/progress
KGEN_TEST_BUILD_ROOT=/tmp/kb timeout 200 python3 -m pytest -m gpu -p no:cacheprovider -q -rfEs tests/test_rotary_norm_gpu.py > $R/t-rotary.log 2>&1
echo "rotary rc=$? $(date)" >> $R/progress
grep -E "passed|failed|error" $R/t-rotary.log | tail -3 > $R/t-rotary-summary.log
timeout 120 python3 -m kgen bench qk_norm_rope_wan --backward --out $R/bench --build-dir /tmp/kb > $R/bench-qk_norm_rope_wan.log 2>&1
echo "bench rc=$? $(date)" >> $R/progress
touch $R/JOB_DONE
