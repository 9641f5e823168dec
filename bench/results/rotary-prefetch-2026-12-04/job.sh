#!/usr/bin/env bash
# lease 2: the rotary kernels holding a head's accesses as loaded (the next head's loads before this one's math):
# base (HEAD 799b786) and new built, every rotary op forward + backward interleaved; then the GPU tests the
# change and the test fixes touch, in parallel groups with separate build roots.
set -u
export PYTHONUNBUFFERED=1
R=/tmp/res; W=/tmp/work
cd $W
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $W/.whl/*.whl > $R/pip.log 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $R/device.txt 2>&1
ROT="qk_norm_rope_flux qk_norm_rope_wan rope rope3d rope3d_coords rope3d_qk rope_apply rope_flux rope_interleaved rope_wan"
(cd $W/.gpu/base && PYTHONPATH=$W/.gpu/base:/tmp/site python3 -m kgen build $ROT --arch sm_90 --compile --jobs 8 --out /tmp/base > $R/build-base.log 2>&1) &
PYTHONPATH=$W:/tmp/site python3 -m kgen build --all --arch sm_90 --compile --jobs 8 --out /tmp/kb > $R/build.log 2>&1
wait
echo "built $(date)" >> $R/progress
export PYTHONPATH=$W:/tmp/site
timeout 300 python3 bench/results/rotary-prefetch-2026-12-04/variants.py /tmp/base /tmp/kb > $R/variants.log 2>&1
echo "variants done $(date)" >> $R/progress
for i in 1 2 3; do cp -r /tmp/kb /tmp/kb$i; done
PT="python3 -m pytest -m gpu -p no:cacheprovider -q -rfEs"
(KGEN_TEST_BUILD_ROOT=/tmp/kb1 timeout 480 $PT tests/test_rotary_norm_gpu.py tests/test_rotary_gpu.py tests/test_softmax_loss_gpu.py > $R/t-rotary.log 2>&1; echo "g1 $(date)" >> $R/progress) &
(KGEN_TEST_BUILD_ROOT=/tmp/kb2 timeout 480 $PT tests/test_backward_gpu.py -k "rope" > $R/t-backward.log 2>&1; echo "g2 $(date)" >> $R/progress) &
(KGEN_TEST_BUILD_ROOT=/tmp/kb3 timeout 480 $PT tests/test_ops_gpu.py tests/test_flux_integration.py tests/test_wan_integration.py > $R/t-ops.log 2>&1; echo "g3 $(date)" >> $R/progress) &
wait
echo "tests done $(date)" >> $R/progress
touch $R/JOB_DONE
