#!/usr/bin/env bash
# lease 1: re-measure the training steps on main (graph-break fix in), with the copies probes.
set -u
export PYTHONUNBUFFERED=1
R=/tmp/res; W=/tmp/work
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $W/.whl/*.whl > $R/pip.log 2>&1
export PYTHONPATH=$W:/tmp/site
cd $W
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $R/device.txt 2>&1
P=bench/results/e2e-ltx-train-2026-12-03
timeout 420 python3 -m kgen bench --e2e qwen3-train --profile --out $R/e2e-q --build-dir /tmp/b-q > $R/e2e-q.log 2>&1
echo "qwen3 e2e done $(date)" >> $R/progress
timeout 200 python3 $P/copies_probe.py qwen3-train /tmp/b-q > $R/copies-qwen3.log 2>&1
echo "qwen3 copies done $(date)" >> $R/progress
timeout 480 python3 -m kgen bench --e2e ltx-train --profile --out $R/e2e-l --build-dir /tmp/b-l > $R/e2e-l.log 2>&1
echo "ltx e2e done $(date)" >> $R/progress
touch $R/JOB_DONE
