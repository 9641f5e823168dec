#!/usr/bin/env bash
# A short lease: the fused q/k norms' forward with two wide heads in flight at three blocks an SM, the grid one
# wave of them (wide-forward.patch: LTX-Video's qk_norm_rope3d and a wide Flux head), timed against main with its
# tests; the generated projects' own tests (now seeded, the seed printed) of three ops; then the suite (`kgen
# bench --all`: issue 14's table; on an H200 the one it asks for), cut at 140 s. Run from a tree of main with the
# wheels in $WHEELS (default .whl/); writes to $R (default /tmp/res), touches $R/JOB_DONE.
set -u
R=${R:-/tmp/res}
mkdir -p "$R"
source scripts/device_env.sh "$R" > "$R/pip.log" 2>&1
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv > "$R/gpu.txt" 2>&1
done_() { echo "$1 rc=$2 $(date)" >> "$R/progress"; }
python3 -m kgen build --all --arch sm_90 --compile --jobs 16 --out /tmp/kb > "$R/build.log" 2>&1
done_ build $?
P=/tmp/tree-fwd
rm -rf $P && cp -r . $P && (cd $P && patch -p1 < bench/results/next/wide-forward.patch) > "$R/patch.log" 2>&1
rm -rf /tmp/kbf && cp -r /tmp/kb /tmp/kbf
(cd $P && python3 -m kgen build qk_norm_rope3d qk_norm_rope_flux --arch sm_90 --compile --jobs 16 --out /tmp/kbf) \
  > "$R/build-fwd.log" 2>&1
done_ "build wide forward" $?
timeout 120 python3 scripts/variants.py /tmp/kb /tmp/kbf qk_norm_rope3d qk_norm_rope_flux --forward \
  > "$R/variants-fwd.md" 2>&1
done_ "variants wide forward" $?
(cd $P && KGEN_TEST_BUILD_ROOT=/tmp/kbf PYTHONPATH=$P:/tmp/site timeout 200 python3 -m pytest -m gpu -q \
  -p no:cacheprovider tests/test_rotary_norm_gpu.py) > "$R/t-fwd.log" 2>&1
done_ "tests rotary norm (wide forward)" $?
T=tests/test_ops_gpu.py::test_the_generated_project_runs_its_own_test_and_benchmark
KGEN_TEST_BUILD_ROOT=/tmp/kb timeout 120 python3 -m pytest -m gpu -q -rA -p no:cacheprovider "$T[rmsnorm]" \
  "$T[qk_norm_rope3d]" "$T[gelu_tanh]" > "$R/t-project.log" 2>&1
done_ "project tests" $?
timeout 140 python3 -m kgen bench --all --out "$R/suite-all" --build-dir /tmp/kb > "$R/suite.log" 2>&1
done_ suite $?
python3 -m kgen report "$R/suite-all" > "$R/report.log" 2>&1
done_ report $?
touch "$R/JOB_DONE"
