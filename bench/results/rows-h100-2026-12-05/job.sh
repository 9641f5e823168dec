#!/usr/bin/env bash
# The GPU work prepared for the next lease (README.md: why each step and what it predicts), on one H200 if one can
# be had, steps in order of need: about 30 minutes after start-up with every step, so the last ones may not fit
# one lease's device time. Run from a tree of main; wheels the machine lacks (pydantic & co., kernels, tomlkit,
# liger-kernel, diffusers) in $WHEELS (default .whl/ of the tree). Writes to $R (default /tmp/res), touches
# $R/JOB_DONE.
set -u
R=${R:-/tmp/res}; HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$R"
source scripts/device_env.sh "$R" > "$R/pip.log" 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv > "$R/gpu.txt" 2>&1
done_() { echo "$1 rc=$2 $(date)" >> "$R/progress"; }
ROWS="residual_adaln_rmsnorm adaln_rmsnorm residual_adaln_layernorm adaln_layernorm rmsnorm fused_add_rmsnorm layernorm"
python3 -m kgen build $ROWS qk_norm_rope qk_norm_rope_flux silu_mul rope cross_entropy --arch sm_90 --compile --jobs 16 \
    --out /tmp/kb > "$R/build.log" 2>&1
done_ build $?
# two template variants, each a tree of main with its patch, built beside main's
variant() {  # variant NAME OP...
  cp -r "$PWD" "/tmp/$1" && (cd "/tmp/$1" && patch -p1 < "$HERE/$1.patch" &&
      PYTHONPATH="/tmp/$1:/tmp/site" python3 -m kgen build "${@:2}" --arch sm_90 --compile --jobs 8 --out "/tmp/k-$1") \
      > "$R/build-$1.log" 2>&1
}
# built together before any timing (a build beside a timing makes host-bound peers slower)
variant rows $ROWS &
ROWS_BUILD=$!
variant shares qk_norm_rope qk_norm_rope_flux &
SHARES=$!
variant widen rmsnorm layernorm fused_add_rmsnorm &
WIDEN=$!
wait $ROWS_BUILD
done_ "build rows" $?
wait $SHARES
done_ "build shares" $?
wait $WIDEN
done_ "build widen" $?
# 1. the row kernels asking for 4 resident blocks of 256 threads (64 registers) where their columns are not held
#    in registers: residual_adaln_rmsnorm per batch is latency-bound at 3 blocks an SM (ncu, H100)
timeout 420 python3 scripts/variants.py /tmp/kb /tmp/k-rows $ROWS > "$R/variants-rows.log" 2>&1
done_ "variants rows" $?
# 2. qk_norm_rope_flux's backward ran 0.88x with the one-weight shares on an H100: the split undone against main
timeout 200 python3 scripts/variants.py /tmp/k-shares /tmp/kb qk_norm_rope_flux qk_norm_rope > "$R/variants-shares.log" 2>&1
done_ "variants shares" $?
# 3. small row counts: the launcher spreads a row over more threads only while each keeps two accesses (rmsnorm
#    64x4096 on sm_90: 256 threads of 2 accesses, not 512 of 1); both orders, for this size's noise
timeout 200 python3 scripts/variants.py /tmp/kb /tmp/k-widen rmsnorm layernorm fused_add_rmsnorm > "$R/variants-widen.log" 2>&1
timeout 200 python3 scripts/variants.py /tmp/k-widen /tmp/kb rmsnorm layernorm fused_add_rmsnorm >> "$R/variants-widen.log" 2>&1
done_ "variants widen" $?
# 3b. branch llama-mask (Llama's causal mask through a thread-local flag and a wrapped create_causal_mask): does
#     this torch's dynamo trace the flag under fullgraph? The branch's test on the real kernels
cp -r "$PWD" /tmp/llama && (cd /tmp/llama && patch -p1 < "$HERE/llama-mask.patch" && PYTHONPATH="/tmp/llama:/tmp/site" \
    timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_transformers_integration.py -k causally) \
    > "$R/llama-mask.log" 2>&1
done_ "llama-mask test" $?
# 4. Qwen3-8B decode as users run it (CUDA graphs: torch.compile as reduce-overhead), prefill with the causal mask
timeout 480 python3 -m kgen bench --e2e qwen3 --graphs --out "$R/after" --build-dir /tmp/kb > "$R/graphs.log" 2>&1
done_ "e2e qwen3 --graphs" $?
# 5. the suite, every op (issue 14's one-run SUMMARY)
timeout 600 python3 -m kgen bench --all --out "$R/suite" --build-dir /tmp/kb > "$R/suite.log" 2>&1
done_ "suite" $?
# 6. end to end on this GPU: Qwen3 prefill / decode and its training step with the mask, LTX-Video, the Wan step
timeout 540 python3 -m kgen bench --e2e qwen3 --profile --out "$R/after" --build-dir /tmp/kb > "$R/qwen3.log" 2>&1
done_ "e2e qwen3" $?
timeout 480 python3 -m kgen bench --e2e qwen3-train --profile --out "$R/after" --build-dir /tmp/kb > "$R/train.log" 2>&1
done_ "e2e qwen3-train" $?
timeout 480 python3 -m kgen bench --e2e ltx --out "$R/after" --build-dir /tmp/kb > "$R/ltx.log" 2>&1
done_ "e2e ltx" $?
timeout 540 python3 -m kgen bench --e2e wan-train --profile --out "$R/after" --build-dir /tmp/kb > "$R/wan-train.log" 2>&1
done_ "e2e wan-train" $?
touch "$R/JOB_DONE"
