#!/usr/bin/env bash
# The GPU check of the cross_entropy op (softmax-loss family) on one H200, about 12 minutes after start-up:
# its GPU tests, the generated project's own test, the transformers loss integration, the benchmark (forward
# and backward, against eager transformers, torch.compile and Liger), then Qwen3's training step with the
# loss served. Run from the tree's root; wheels the machine lacks in $WHEELS (default .whl/); writes to $R
# (default /tmp/res) and touches $R/JOB_DONE at the end.
set -u
export PYTHONUNBUFFERED=1
R=${R:-/tmp/res}; WHEELS=${WHEELS:-.whl}
mkdir -p "$R"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$WHEELS"/*.whl > "$R/pip.log" 2>&1
export PYTHONPATH=$PWD:/tmp/site KGEN_TEST_BUILD_ROOT=/tmp/b-ce
python3 -m kgen build cross_entropy rmsnorm silu_mul rope --arch sm_90 --compile --jobs 8 --out /tmp/b-ce > "$R/build.log" 2>&1
echo "built $(date)" >> "$R/progress"
timeout 420 python3 -m pytest tests/test_softmax_loss_gpu.py -m gpu -q -p no:cacheprovider -rfE > "$R/t-softmax-loss.log" 2>&1
timeout 200 python3 -m pytest tests/test_ops_gpu.py -m gpu -q -p no:cacheprovider -rfE -k "generated_project and cross_entropy" > "$R/t-project.log" 2>&1
timeout 300 python3 -m pytest tests/test_transformers_integration.py -m gpu -q -p no:cacheprovider -rfE -k "loss or training" > "$R/t-transformers.log" 2>&1
echo "tests done $(date)" >> "$R/progress"
timeout 400 python3 -m kgen bench cross_entropy --out "$R/bench" --build-dir /tmp/b-ce > "$R/bench.log" 2>&1
timeout 400 python3 -m kgen bench cross_entropy --backward --out "$R/bench" --build-dir /tmp/b-ce > "$R/bench-backward.log" 2>&1
echo "bench done $(date)" >> "$R/progress"
timeout 420 python3 -m kgen bench --e2e qwen3-train --profile --out "$R/e2e" --build-dir /tmp/b-ce > "$R/e2e.log" 2>&1
echo "e2e done $(date)" >> "$R/progress"
touch "$R/JOB_DONE"
