#!/usr/bin/env bash
# The GPU work prepared for the next lease (README.md: why each step and what it predicts), in order of need:
# 0 rope3d's angles shared by the batch (a patch, measured against main), 1 LTX-Video end to end with the GPU's SM clock and power sampled through it (do the same GEMMs and attention
# run slower in a denser step because the clock drops?), 1b its training step, 2 Llama-3-8B end to end under CUDA graphs, 3 on an
# H200 the whole suite and Qwen3-8B under CUDA graphs (issue 14's tables from one H200 run). About 15 minutes
# after start-up on an H100, 27 on an H200. Run
# from a tree of main; wheels the machine lacks (pydantic & co., kernels, tomlkit, liger-kernel, diffusers) in
# $WHEELS (default .whl/ of the tree). Writes to $R (default /tmp/res), touches $R/JOB_DONE.
set -u
R=${R:-/tmp/res}
mkdir -p "$R"
source scripts/device_env.sh "$R" > "$R/pip.log" 2>&1
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv > "$R/gpu.txt" 2>&1
done_() { echo "$1 rc=$2 $(date)" >> "$R/progress"; }
stamped() { while IFS= read -r line; do echo "$(date +%s.%N) $line"; done; }
python3 -m kgen build --all --arch sm_90 --compile --jobs 16 --out /tmp/kb > "$R/build.log" 2>&1
done_ build $?
# 0. rope3d's angles shared by the batch (batch-angles.patch: a thread takes every batch's heads of its token
#    where the angles depend on the grid alone): the patched tree's rotary GPU tests, then its builds against
#    main's (forward and derived backward, outputs compared bitwise)
P=/tmp/tree-batch
rm -rf $P && cp -r . $P && (cd $P && patch -p1 < bench/results/next/batch-angles.patch) > "$R/patch.log" 2>&1
rm -rf /tmp/kbp && cp -r /tmp/kb /tmp/kbp  # main's builds of the other ops, for the tests' fixtures
(cd $P && python3 -m kgen build rope3d rope3d_qk qk_norm_rope3d rope_wan --arch sm_90 --compile --out /tmp/kbp) \
  > "$R/build-batch.log" 2>&1
(cd $P && KGEN_TEST_BUILD_ROOT=/tmp/kbp PYTHONPATH=$P:/tmp/site timeout 300 python3 -m pytest -m gpu -q \
  -p no:cacheprovider tests/test_rotary_gpu.py tests/test_rotary_norm_gpu.py tests/test_errors_gpu.py \
  tests/test_backward_gpu.py -k "rope3d or rope_wan") > "$R/t-batch.log" 2>&1
done_ "tests batch angles" $?
timeout 240 python3 scripts/variants.py /tmp/kb /tmp/kbp rope3d rope3d_qk qk_norm_rope3d rope_wan \
  > "$R/variants-batch.md" 2>&1
done_ "variants batch angles" $?
# 1. LTX-Video with the clock: nvidia-smi samples every 100 ms, the log's lines stamped with the same clock. With
#    the batch's shared angles when their tests passed (the patched tree and its builds), then main's build
#    without the profiler: the end to end before and after in one run
if grep -q "passed" "$R/t-batch.log" && ! grep -qE "[0-9]+ (failed|error)" "$R/t-batch.log"; then
  TREE=$P BUILD=/tmp/kbp
else
  TREE=$PWD BUILD=/tmp/kb
fi
echo "end to end from $TREE with $BUILD" >> "$R/progress"
Q=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu
nvidia-smi --query-gpu=$Q,clocks_event_reasons.active --format=csv -lms 100 > "$R/clocks.csv" 2>&1 &
SMI=$!
sleep 2
if ! kill -0 $SMI 2>/dev/null; then  # a driver without the event reasons' field: the clock and power alone
  nvidia-smi --query-gpu=$Q --format=csv -lms 100 > "$R/clocks.csv" 2>&1 &
  SMI=$!
fi
(cd $TREE && timeout 480 python3 -m kgen bench --e2e ltx --profile --out "$R/e2e" --build-dir $BUILD) 2>&1 \
  | stamped > "$R/ltx.log"
done_ "e2e ltx --profile" $?
kill $SMI
if [ "$BUILD" != /tmp/kb ]; then
  timeout 420 python3 -m kgen bench --e2e ltx --out "$R/e2e-main" --build-dir /tmp/kb > "$R/ltx-main.log" 2>&1
  done_ "e2e ltx (main)" $?
fi
# 1b. LTX-Video's training step with qk_norm_rope3d's derived backward (one call forward, one backward, where
#     rmsnorm ×2 + rope3d_qk made three and three)
(cd $TREE && timeout 300 python3 -m kgen bench --e2e ltx-train --out "$R/e2e" --build-dir $BUILD) \
  > "$R/ltx-train.log" 2>&1
done_ "e2e ltx-train" $?
# 2. Llama-3-8B's prefill and decode step under CUDA graphs (its grouped decode attention, first timed here)
timeout 480 python3 -m kgen bench --e2e llama --graphs --out "$R/e2e" --build-dir /tmp/kb > "$R/llama.log" 2>&1
done_ "e2e llama --graphs" $?
# 3. on an H200 only: the whole suite and Qwen3-8B under CUDA graphs
if grep -q H200 "$R/gpu.txt"; then
  timeout 420 python3 -m kgen bench --all --out "$R/suite-all" --build-dir /tmp/kb > "$R/suite.log" 2>&1
  done_ suite $?
  python3 -m kgen report "$R/suite-all" > "$R/report.log" 2>&1
  timeout 480 python3 -m kgen bench --e2e qwen3 --graphs --out "$R/e2e" --build-dir /tmp/kb > "$R/qwen3.log" 2>&1
  done_ "e2e qwen3 --graphs" $?
fi
touch "$R/JOB_DONE"
