#!/usr/bin/env bash
# lease 1: staged buffers 2/3/4 and the sub-warp ladder against main; ncu; backward GPU tests on b3
set -u
export PYTHONUNBUFFERED=1
R=/tmp/res; W=/tmp/work
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $W/.whl/*.whl > $R/pip.log 2>&1
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/device.txt
python3 -c 'import torch; print("torch", torch.__version__)' >> $R/device.txt
OPS="rmsnorm layernorm fused_add_rmsnorm adaln_rmsnorm residual_adaln_layernorm adaln_layernorm"
for v in main b2 b3 b4; do
  mkdir -p /tmp/v/$v && tar xzf $W/.gpu/v-$v.tgz -C /tmp/v/$v
  (cd /tmp/v/$v && for op in $OPS; do PYTHONPATH=/tmp/v/$v:/tmp/site python3 -m kgen build $op --arch sm_90 --compile --out /tmp/build-$v; done > $R/build-$v.log 2>&1) &
done
wait
echo "builds done $(date)" >> $R/progress
python3 $W/.gpu/copybw.py > $R/copy.jsonl 2>&1
BD=$W/bench/results/backward-kernels-2026-12-03/breakdown.py
CS="rmsnorm:1x128x4096,rmsnorm:1x8192x4096,rmsnorm:65536x128,rmsnorm:5376x2048,layernorm:5376x2048,fused_add_rmsnorm:8192x4096,adaln_rmsnorm:2x8064x2048,residual_adaln_layernorm:2x8064x2048"
for v in main b2 b3 b4; do
  extra=""; [ $v = main ] && extra="--compile-shapes $CS"
  (cd /tmp/v/$v && PYTHONPATH=/tmp/v/$v:/tmp/site python3 $BD /tmp/build-$v ${OPS// /,} --tag $v $extra > $R/breakdown-$v.jsonl 2> $R/breakdown-$v.err)
  echo "breakdown $v done $(date)" >> $R/progress
done
ND=$W/bench/results/backward-kernels-2026-12-03/ncu_driver.py
for v in main b3; do for shape in 1x128x4096 1x8192x4096; do
  (cd /tmp/v/$v && PYTHONPATH=/tmp/v/$v:/tmp/site timeout 120 ncu --clock-control none --profile-from-start off --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats python3 $ND /tmp/build-$v rmsnorm $shape > $R/ncu-$v-rmsnorm-$shape.log 2>&1)
done; done
echo "ncu done $(date)" >> $R/progress
# the backward GPU tests on b3 (every op built first: the fixture builds all)
cd /tmp/v/b3 && PYTHONPATH=/tmp/v/b3:/tmp/site python3 -m kgen build --all --arch sm_90 --compile --jobs 16 --out /tmp/kgen-build > $R/build-all-b3.log 2>&1
echo "build all done $(date)" >> $R/progress
cd /tmp/v/b3 && KGEN_TEST_BUILD_ROOT=/tmp/kgen-build PYTHONPATH=/tmp/v/b3:/tmp/site timeout 400 python3 -m pytest tests/test_backward_gpu.py -m gpu -q -x -p no:cacheprovider > $R/t-backward-b3.log 2>&1
echo "tests done $(date)" >> $R/progress
touch $R/JOB_DONE
