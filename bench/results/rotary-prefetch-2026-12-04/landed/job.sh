#!/usr/bin/env bash
# lease 3: main's head (the two-head rotary kernels holding heads as loaded, as landed): the rotary GPU tests,
# the rotary backwards, the diffusers integrations (LTX-Video, Flux, Wan), in parallel groups.
set -u
export PYTHONUNBUFFERED=1
R=/tmp/res; W=/tmp/work
cd $W
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $W/.whl/*.whl > $R/pip.log 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $R/device.txt 2>&1
export PYTHONPATH=$W:/tmp/site
python3 -m kgen build --all --arch sm_90 --compile --jobs 16 --out /tmp/kb > $R/build.log 2>&1
for i in 1 2 3; do cp -r /tmp/kb /tmp/kb$i; done
echo "built $(date)" >> $R/progress
PT="python3 -m pytest -m gpu -p no:cacheprovider -q -rfEs"
(KGEN_TEST_BUILD_ROOT=/tmp/kb1 timeout 400 $PT tests/test_rotary_gpu.py tests/test_rotary_norm_gpu.py > $R/t-rotary.log 2>&1; echo "g1 $(date)" >> $R/progress) &
(KGEN_TEST_BUILD_ROOT=/tmp/kb2 timeout 400 $PT tests/test_backward_gpu.py -k "rope" > $R/t-backward.log 2>&1; echo "g2 $(date)" >> $R/progress) &
(KGEN_TEST_BUILD_ROOT=/tmp/kb3 timeout 400 $PT tests/test_diffusers_integration.py tests/test_flux_integration.py tests/test_wan_integration.py > $R/t-integ.log 2>&1; echo "g3 $(date)" >> $R/progress) &
wait
echo "tests done $(date)" >> $R/progress
touch $R/JOB_DONE
