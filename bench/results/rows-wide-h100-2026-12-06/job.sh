#!/usr/bin/env bash
# The GPU work prepared for the next lease (README.md: why each step and what it predicts), in order of need:
# 1 the GPU tests of the row ops whose plan changed (one-reduction rows on wider steps) and of the models they
# serve, 2 the whole suite, 3 LTX-Video end to end (it runs residual_adaln_rmsnorm / adaln_rmsnorm), 4 on an
# H200 Qwen3-8B end to end under CUDA graphs. About 12 minutes after start-up on an H100, 20 on an H200. Run
# from a tree of main; wheels the machine lacks (pydantic & co., kernels, tomlkit, liger-kernel, diffusers) in
# $WHEELS (default .whl/ of the tree). Writes to $R (default /tmp/res), touches $R/JOB_DONE.
set -u
R=${R:-/tmp/res}
mkdir -p "$R"
source scripts/device_env.sh "$R" > "$R/pip.log" 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv > "$R/gpu.txt" 2>&1
done_() { echo "$1 rc=$2 $(date)" >> "$R/progress"; }
export KGEN_TEST_BUILD_ROOT=/tmp/kb
python3 -m kgen build --all --arch sm_90 --compile --jobs 16 --out /tmp/kb > "$R/build.log" 2>&1
done_ build $?
# 1. the changed row ops (every test naming rmsnorm: rmsnorm, fused_add_rmsnorm, adaln_rmsnorm,
#    residual_adaln_rmsnorm), the row invariants, and the Qwen3 / Llama / LTX-Video integrations
timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_ops_gpu.py tests/test_rmsnorm_gpu.py \
  tests/test_errors_gpu.py tests/test_backward_gpu.py tests/test_multi_arch_gpu.py -k rmsnorm \
  > "$R/t-rows.log" 2>&1
done_ "tests rows" $?
timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_invariants_gpu.py \
  tests/test_transformers_integration.py tests/test_diffusers_integration.py > "$R/t-models.log" 2>&1
done_ "tests invariants, models" $?
# 2. the whole suite
timeout 420 python3 -m kgen bench --all --out "$R/suite-all" --build-dir /tmp/kb > "$R/suite.log" 2>&1
done_ suite $?
python3 -m kgen report "$R/suite-all" > "$R/report.log" 2>&1
# 3. LTX-Video end to end
timeout 420 python3 -m kgen bench --e2e ltx --out "$R/e2e" --build-dir /tmp/kb > "$R/ltx.log" 2>&1
done_ "e2e ltx" $?
# 4. on an H200 only: Qwen3-8B under CUDA graphs (issue 14's tables from one H200 run)
if grep -q H200 "$R/gpu.txt"; then
  timeout 480 python3 -m kgen bench --e2e qwen3 --graphs --out "$R/e2e" --build-dir /tmp/kb > "$R/qwen3.log" 2>&1
  done_ "e2e qwen3 --graphs" $?
fi
touch "$R/JOB_DONE"
