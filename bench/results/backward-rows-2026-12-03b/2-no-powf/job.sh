#!/usr/bin/env bash
# lease 2: main vs final (sub-warp ladder + no powf + static shared opt-in): breakdown, ncu, backward GPU tests
set -u
export PYTHONUNBUFFERED=1
R=/tmp/res; W=/tmp/work
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $W/.whl/*.whl > $R/pip.log 2>&1
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/device.txt
python3 -c 'import torch; print("torch", torch.__version__)' >> $R/device.txt
OPS="rmsnorm layernorm fused_add_rmsnorm adaln_rmsnorm residual_adaln_rmsnorm residual_adaln_layernorm adaln_layernorm adaln_layernorm_fp32 residual_adaln_layernorm_fp32 residual_layernorm_fp32"
for v in main final; do mkdir -p /tmp/v/$v && tar xzf $W/.gpu/v-$v.tgz -C /tmp/v/$v; done
(cd /tmp/v/main && for op in $OPS; do PYTHONPATH=/tmp/v/main:/tmp/site python3 -m kgen build $op --arch sm_90 --compile --out /tmp/build-main; done > $R/build-main.log 2>&1) &
(cd /tmp/v/final && PYTHONPATH=/tmp/v/final:/tmp/site python3 -m kgen build --all --arch sm_90 --compile --jobs 12 --out /tmp/kgen-build > $R/build-final.log 2>&1) &
wait
echo "builds done $(date)" >> $R/progress
python3 $W/.gpu/copybw.py > $R/copy.jsonl 2>&1
BD=$W/bench/results/backward-kernels-2026-12-03/breakdown.py
CS="rmsnorm:1x128x4096,rmsnorm:1x8192x4096,rmsnorm:65536x128,rmsnorm:262144x128,rmsnorm:5376x2048,layernorm:5376x2048,layernorm:1x8192x4096,fused_add_rmsnorm:8192x4096,adaln_rmsnorm:2x8064x2048,residual_adaln_layernorm:2x8064x2048"
(cd /tmp/v/main && PYTHONPATH=/tmp/v/main:/tmp/site python3 $BD /tmp/build-main ${OPS// /,} --tag main > $R/breakdown-main.jsonl 2> $R/breakdown-main.err)
echo "breakdown main done $(date)" >> $R/progress
(cd /tmp/v/final && PYTHONPATH=/tmp/v/final:/tmp/site python3 $BD /tmp/kgen-build ${OPS// /,} --tag final --compile-shapes $CS > $R/breakdown-final.jsonl 2> $R/breakdown-final.err)
echo "breakdown final done $(date)" >> $R/progress
ND=$W/bench/results/backward-kernels-2026-12-03/ncu_driver.py
cd /tmp/v/final
for shape in 1x128x4096 1x8192x4096; do
  PYTHONPATH=/tmp/v/final:/tmp/site timeout 90 ncu --clock-control none --profile-from-start off -k regex:backward_kernel --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats --section Occupancy python3 $ND /tmp/kgen-build rmsnorm $shape > $R/ncu-final-rmsnorm-$shape.log 2>&1
done
PYTHONPATH=/tmp/v/final:/tmp/site timeout 90 ncu --clock-control none --profile-from-start off -k regex:backward_kernel --section WarpStateStats --section SourceCounters --page source --print-source sass python3 $ND /tmp/kgen-build rmsnorm 1x128x4096 > $R/ncu-source-rmsnorm-1x128x4096.log 2>&1
echo "ncu done $(date)" >> $R/progress
KGEN_TEST_BUILD_ROOT=/tmp/kgen-build PYTHONPATH=/tmp/v/final:/tmp/site timeout 300 python3 -m pytest tests/test_backward_gpu.py -m gpu -q -p no:cacheprovider > $R/t-backward.log 2>&1
echo "tests done $(date)" >> $R/progress
touch $R/JOB_DONE
