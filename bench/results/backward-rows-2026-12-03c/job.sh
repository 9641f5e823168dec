#!/usr/bin/env bash
# The GPU check of the four backward changes of a42e2d5, on one H200: builds the ten column-reduction ops from two source
# archives (before = main, after = main with the patches applied and `kgen build --all` run), runs every
# op's backward GPU tests on "after", then breakdown.py on both (all suite shapes of the ten ops) and
# torch.compile at the shapes where it led. Archives: `git archive -o /tmp/v-before.tgz main` and the same of
# the patched tree; pass their directory as $1 (default: the directory of this script). Wheels the machine
# lacks in $WHEELS (default .whl/ of the tree). Writes to $R (default /tmp/res), touches $R/JOB_DONE at the end.
set -u
export PYTHONUNBUFFERED=1
A=${1:-$(dirname "$0")}; R=${R:-/tmp/res}; WHEELS=${WHEELS:-.whl}
mkdir -p "$R"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$WHEELS"/*.whl > "$R/pip.log" 2>&1
export PYTHONPATH=/tmp/site
OPS="rmsnorm layernorm fused_add_rmsnorm adaln_rmsnorm residual_adaln_rmsnorm residual_adaln_layernorm adaln_layernorm adaln_layernorm_fp32 residual_adaln_layernorm_fp32 residual_layernorm_fp32"
for v in before after; do mkdir -p /tmp/v/$v && tar xzf "$A/v-$v.tgz" -C /tmp/v/$v; done
(cd /tmp/v/before && PYTHONPATH=/tmp/v/before:/tmp/site python3 -m kgen build $OPS --arch sm_90 --compile --jobs 6 --out /tmp/build-before > "$R/build-before.log" 2>&1) &
(cd /tmp/v/after && PYTHONPATH=/tmp/v/after:/tmp/site python3 -m kgen build $OPS --arch sm_90 --compile --jobs 10 --out /tmp/build-after > "$R/build-after.log" 2>&1) &
wait
cd /tmp/v/after
sed -i "s/^OPS = \[op for op in op_names() if /OPS = [op for op in op_names() if op in '$OPS'.split() and /" tests/test_backward_gpu.py
KGEN_TEST_BUILD_ROOT=/tmp/build-after PYTHONPATH=/tmp/v/after:/tmp/site timeout 300 python3 -m pytest tests/test_backward_gpu.py -m gpu -q -p no:cacheprovider > "$R/t-backward.log" 2>&1
BD=/tmp/v/after/bench/results/backward-kernels-2026-12-03/breakdown.py
CS="layernorm:1x8192x4096,adaln_rmsnorm:2x8064x2048,residual_adaln_layernorm:2x8064x2048,rmsnorm:2x4096x3072,layernorm:1x4608x3072"
for v in before after; do
  extra=""; [ $v = after ] && extra="--compile-shapes $CS"
  (cd /tmp/v/$v && PYTHONPATH=/tmp/v/$v:/tmp/site python3 $BD /tmp/build-$v ${OPS// /,} --tag $v $extra > "$R/breakdown-$v.jsonl" 2> "$R/breakdown-$v.err")
done
python3 /tmp/v/after/bench/results/backward-rows-2026-12-03b/copybw.py > "$R/copy.jsonl" 2>&1
python3 /tmp/v/after/bench/results/backward-kernels-2026-12-03/table.py "$R/breakdown-before.jsonl" "$R/breakdown-after.jsonl" > "$R/table.md"
# optional: E2E="qwen3-train ltx-train" reruns the training steps on "after" (5-7 minutes each; liger-kernel's
# wheel among $WHEELS for the Liger variant)
for target in ${E2E:-}; do
  (cd /tmp/v/after && PYTHONPATH=/tmp/v/after:/tmp/site python3 -m kgen bench --e2e "$target" --out "$R" \
    --build-dir /tmp/build-after > "$R/e2e-$target.log" 2>&1)
done
touch "$R/JOB_DONE"
