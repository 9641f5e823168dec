#!/usr/bin/env bash
# A short lease for main as landed on 2026-12-07 (2ba924a8: wide weight partial rows of the fused q/k norm's
# backward; d137c2d6: LTX-Video's compiled training step leaves its blocks to Inductor), neither run on a GPU as
# landed: the fused q/k norms' backward against the tree before 2ba924a8 (partials.patch reversed) for Qwen3's and
# Flux's, the rotary norm tests and the LTX-Video integration's on the GPU (in parallel), then the training step
# end to end. Writes to $R (default /tmp/res), touches $R/JOB_DONE.
set -u
R=${R:-/tmp/res}
mkdir -p "$R"
source scripts/device_env.sh "$R" > "$R/pip.log" 2>&1
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv > "$R/gpu.txt" 2>&1
done_() { echo "$1 rc=$2 $(date)" >> "$R/progress"; }
M=/tmp/tree-main
rm -rf $M && cp -r . $M && (cd $M && patch -R -p1 < bench/results/landed-h100-2026-12-07/partials.patch) > "$R/patch.log" 2>&1
(cd $M && python3 -m kgen build qk_norm_rope qk_norm_rope_flux --arch sm_90 --compile --jobs 8 --out /tmp/kb) \
  > "$R/build-main.log" 2>&1 &
python3 -m kgen build qk_norm_rope3d qk_norm_rope qk_norm_rope_flux adaln_rmsnorm residual_adaln_rmsnorm \
  residual_adaln_layernorm rmsnorm gelu_tanh --arch sm_90 --compile --jobs 12 --out /tmp/kbF > "$R/build.log" 2>&1
done_ "build" $?
wait
done_ "build main" 0
(cd $M && timeout 60 python3 scripts/variants.py /tmp/kb /tmp/kbF qk_norm_rope qk_norm_rope_flux) > "$R/variants.md" 2>&1
done_ "variants" $?
KGEN_TEST_BUILD_ROOT=/tmp/kbF timeout 170 python3 -m pytest -m gpu -q -p no:cacheprovider \
  tests/test_rotary_norm_gpu.py > "$R/t-rotary-norm.log" 2>&1 &
KGEN_TEST_BUILD_ROOT=/tmp/kbF timeout 170 python3 -m pytest -m gpu -q -p no:cacheprovider \
  tests/test_diffusers_integration.py > "$R/t-ltx.log" 2>&1
done_ "tests ltx integration" $?
wait
done_ "tests rotary norm" 0
timeout 150 python3 -m kgen bench --e2e ltx-train --profile --out "$R/e2e" --build-dir /tmp/kbF > "$R/ltx-train.log" 2>&1
done_ "e2e ltx-train" $?
touch "$R/JOB_DONE"
