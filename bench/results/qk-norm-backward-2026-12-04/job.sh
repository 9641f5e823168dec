#!/usr/bin/env bash
# lease 1: the autograd binding saving after the call (every op's binding), qk_norm_rope_flux's derived backward:
# the whole GPU suite in 4 parallel groups (separate build roots), then qk_norm_rope_flux's backward benchmark.
set -u
export PYTHONUNBUFFERED=1
R=/tmp/res; W=/tmp/work
cd $W
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $W/.whl/*.whl > $R/pip.log 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $R/device.txt 2>&1
export PYTHONPATH=$W:/tmp/site
python3 -m kgen build --all --arch sm_90 --compile --jobs 16 --out /tmp/kb > $R/build.log 2>&1
for i in 1 2 3 4; do cp -r /tmp/kb /tmp/kb$i; done
echo "built $(date)" >> $R/progress
PT="python3 -m pytest -m gpu -p no:cacheprovider -q -rfEs"
(KGEN_TEST_BUILD_ROOT=/tmp/kb1 timeout 520 $PT tests/test_rotary_norm_gpu.py tests/test_backward_gpu.py > $R/t-backward.log 2>&1; echo "g1 $(date)" >> $R/progress) &
(KGEN_TEST_BUILD_ROOT=/tmp/kb2 timeout 520 $PT tests/test_ops_gpu.py > $R/t-ops.log 2>&1; echo "g2 $(date)" >> $R/progress) &
(KGEN_TEST_BUILD_ROOT=/tmp/kb3 timeout 520 $PT tests/test_errors_gpu.py tests/test_invariants_gpu.py tests/test_multi_arch_gpu.py tests/test_rmsnorm_gpu.py tests/test_rotary_gpu.py tests/test_families.py tests/test_toolchain.py tests/test_e2e.py > $R/t-rest.log 2>&1; echo "g3 $(date)" >> $R/progress) &
(KGEN_TEST_BUILD_ROOT=/tmp/kb4 timeout 520 $PT tests/test_softmax_loss_gpu.py tests/test_transformers_integration.py tests/test_diffusers_integration.py tests/test_flux_integration.py tests/test_wan_integration.py > $R/t-integ.log 2>&1; echo "g4 $(date)" >> $R/progress) &
wait
echo "tests done $(date)" >> $R/progress
timeout 300 python3 -m kgen bench qk_norm_rope_flux --backward --out $R/bench --build-dir /tmp/kb > $R/bench-backward.log 2>&1
echo "bench done $(date)" >> $R/progress
touch $R/JOB_DONE
