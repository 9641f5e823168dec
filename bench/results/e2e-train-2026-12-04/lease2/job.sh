#!/usr/bin/env bash
# lease 2: host time per call before/after the lean binding (host probe), the GPU suite on the new tree,
# then LTX-Video's training step (and Qwen3's) on the new tree.
set -u
export PYTHONUNBUFFERED=1
R=/tmp/res; W=/tmp/work
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $W/.whl/*.whl > $R/pip.log 2>&1
P=$W/bench/results/e2e-ltx-train-2026-12-03/next/host_probe.py
rm -rf /tmp/before && cp -r $W /tmp/before && (cd /tmp/before && patch -R -p1 -s < $W/.gpu/host.patch) > $R/patch.log 2>&1
cd $W
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $R/device.txt 2>&1
export PYTHONPATH=$W:/tmp/site
python3 -m kgen build --all --arch sm_90 --compile --jobs 16 --out /tmp/kb > $R/build.log 2>&1
echo "built $(date)" >> $R/progress
(cd /tmp/before && PYTHONPATH=/tmp/before:/tmp/site timeout 300 python3 $P /tmp/hb-before > $R/host-before.jsonl 2> $R/host-before.err)
echo "host before $(date)" >> $R/progress
timeout 300 python3 $P /tmp/kb > $R/host-after.jsonl 2> $R/host-after.err
echo "host after $(date)" >> $R/progress
KGEN_TEST_BUILD_ROOT=/tmp/kb timeout 420 python3 -m pytest tests -m gpu -p no:cacheprovider -q -rfEs --ignore=tests/test_transformers_integration.py > $R/t-gpu.log 2>&1
echo "tests $(date)" >> $R/progress
timeout 420 python3 -m kgen bench --e2e ltx-train --profile --out $R/e2e-l --build-dir /tmp/kb > $R/e2e-l.log 2>&1
echo "ltx e2e $(date)" >> $R/progress
KGEN_TEST_BUILD_ROOT=/tmp/kb timeout 300 python3 -m pytest tests/test_transformers_integration.py -m gpu -p no:cacheprovider -q -rfEs > $R/t-transformers.log 2>&1
echo "transformers tests $(date)" >> $R/progress
touch $R/JOB_DONE
