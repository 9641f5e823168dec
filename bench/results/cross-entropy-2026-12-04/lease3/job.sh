#!/usr/bin/env bash
# lease 3: cross_entropy's gradient from the saved loss (one read of the logits): its tests, the errors suite's
# cross_entropy cases, the generated project, the transformers loss, `kgen bench cross_entropy --backward`,
# then Qwen3's training step.
set -u
export PYTHONUNBUFFERED=1
R=/tmp/res; W=/tmp/work
cd $W
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $W/.whl/*.whl > $R/pip.log 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $R/device.txt 2>&1
export PYTHONPATH=$W:/tmp/site
python3 -m kgen build cross_entropy rmsnorm silu_mul rope --arch sm_90 --compile --jobs 16 --out /tmp/kb > $R/build.log 2>&1
cp -r /tmp/kb /tmp/kb2; cp -r /tmp/kb /tmp/kb3
echo "built $(date)" >> $R/progress
PT="python3 -m pytest -m gpu -p no:cacheprovider -q -rfEs"
(KGEN_TEST_BUILD_ROOT=/tmp/kb timeout 300 $PT tests/test_softmax_loss_gpu.py > $R/t-loss.log 2>&1; KGEN_TEST_BUILD_ROOT=/tmp/kb timeout 200 $PT tests/test_errors_gpu.py -k cross_entropy > $R/t-errors.log 2>&1; echo "g1 $(date)" >> $R/progress) &
(KGEN_TEST_BUILD_ROOT=/tmp/kb2 timeout 300 $PT tests/test_ops_gpu.py -k "generated_project and cross_entropy" > $R/t-project.log 2>&1; echo "g2 $(date)" >> $R/progress) &
(KGEN_TEST_BUILD_ROOT=/tmp/kb3 timeout 300 $PT tests/test_transformers_integration.py -k "loss or training" > $R/t-transformers.log 2>&1; echo "g3 $(date)" >> $R/progress) &
wait
echo "tests done $(date)" >> $R/progress
timeout 300 python3 -m kgen bench cross_entropy --backward --out $R/bench --build-dir /tmp/kb > $R/bench-backward.log 2>&1
echo "bench done $(date)" >> $R/progress
timeout 400 python3 -m kgen bench --e2e qwen3-train --profile --out $R/e2e --build-dir /tmp/kb > $R/e2e.log 2>&1
echo "e2e done $(date)" >> $R/progress
touch $R/JOB_DONE
