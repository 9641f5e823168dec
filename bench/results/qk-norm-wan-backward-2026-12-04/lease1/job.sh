#!/usr/bin/env bash
# lease 1: qk_norm_rope_wan's derived backward, the shared ordered column sum (every row-reduction backward and
# the rotary backwards): the GPU suite in 4 parallel groups (separate build roots), then the backward benchmarks.
set -u
export PYTHONUNBUFFERED=1
R=/tmp/res; W=/tmp/work
cd $W
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $W/.whl/*.whl > $R/pip.log 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $R/device.txt 2>&1
python3 -c 'import torch; print("torch", torch.__version__)' >> $R/device.txt 2>&1
export PYTHONPATH=$W:/tmp/site
python3 -m kgen build --all --arch sm_90 --compile --jobs 16 --out /tmp/kb > $R/build.log 2>&1
echo "built rc=$? $(date)" >> $R/progress
for i in 1 2 3 4; do cp -r /tmp/kb /tmp/kb$i; done
PT="python3 -m pytest -m gpu -p no:cacheprovider -q -rfEs"
run() {  # group name, build root, tests...
  local name=$1 root=$2; shift 2
  KGEN_TEST_BUILD_ROOT=$root timeout 500 $PT "$@" > $R/t-$name.log 2>&1
  echo "$name rc=$? $(date)" >> $R/progress
  grep -E "passed|failed|error" $R/t-$name.log | tail -3 > $R/t-$name-summary.log
}
run rotary /tmp/kb1 tests/test_rotary_norm_gpu.py tests/test_rotary_gpu.py &
run backward /tmp/kb2 tests/test_backward_gpu.py &
run integ /tmp/kb3 tests/test_wan_integration.py tests/test_flux_integration.py tests/test_diffusers_integration.py tests/test_transformers_integration.py tests/test_softmax_loss_gpu.py &
run rest /tmp/kb4 tests/test_ops_gpu.py tests/test_errors_gpu.py tests/test_invariants_gpu.py tests/test_multi_arch_gpu.py tests/test_rmsnorm_gpu.py tests/test_families.py tests/test_e2e.py &
wait
echo "tests done $(date)" >> $R/progress
for op in qk_norm_rope_wan qk_norm_rope_flux; do
  timeout 240 python3 -m kgen bench $op --backward --out $R/bench --build-dir /tmp/kb > $R/bench-$op.log 2>&1
  echo "bench $op rc=$? $(date)" >> $R/progress
done
touch $R/JOB_DONE
