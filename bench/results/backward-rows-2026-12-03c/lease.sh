#!/usr/bin/env bash
set -u
export PYTHONUNBUFFERED=1
R=/tmp/res; W=/tmp/work
cd $W
R=$R WHEELS=$W/.whl bash $W/bench/results/backward-rows-2026-12-03c/job.sh $W/.gpu > $R/next-job.log 2>&1
rm -f $R/JOB_DONE
echo "next job done $(date)" >> $R/progress
PYTHONPATH=/tmp/site python3 $W/bench/results/backward-rows-2026-12-03c/ce_probe.py > $R/ce_probe.log 2>&1
echo "ce probe done $(date)" >> $R/progress
(cd /tmp/v/after && PYTHONPATH=/tmp/v/after:/tmp/site python3 -m kgen bench --e2e qwen3-train --profile --out $R/e2e \
    --build-dir /tmp/build-after > "$R/e2e-qwen3-train.log" 2>&1)
echo "e2e done $(date)" >> $R/progress
touch $R/JOB_DONE
