#!/usr/bin/env bash
# compute-sanitizer over the GPU tests that run every op's kernels at small and edge sizes (edge
# hidden sizes, strided, misaligned and empty input, broadcasts, in-place forms, NaN/Inf, rotary
# layouts): memcheck, racecheck, initcheck and synccheck, one process each, at once. memcheck,
# racecheck and synccheck instrument only kgen's kernels (--kernel-name kns=kgen_); initcheck
# instruments every kernel, since memory that PyTorch's kernels wrote (torch.randn) would otherwise
# count as uninitialized. PyTorch's caching allocator is off, so an out-of-bounds access cannot land
# in a neighbouring cached block. Logs and a summary land in $OUT
# (default ./sanitize-out); the exit status is non-zero if a tool reports an error or a test fails.
# Expects the ops built into $KGEN_TEST_BUILD_ROOT (scripts/gpu_check.sh does that) or builds them.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/sanitize-out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1
export KGEN_TEST_BUILD_ROOT=${KGEN_TEST_BUILD_ROOT:-/tmp/kgen-build}
TOOLS=${TOOLS:-memcheck racecheck initcheck synccheck}
SELECT=${SELECT:-"edge_hidden_sizes or strided_and_misaligned or empty_input or inplace_form or nan_and_inf \
or rotary_misaligned or rotary_edge or transformers_layouts or rope_in_place"}
# initcheck is the slowest (it shadows every allocation): float32 cases only (dtype0)
INITCHECK_SELECT=${INITCHECK_SELECT:-"($SELECT) and not dtype1 and not dtype2"}
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
"$SAN" --version | tail -1 | tee "$OUT/summary.txt"
for tool in $TOOLS; do
  filter=(--kernel-name kns=kgen_) select=$SELECT
  [ "$tool" = initcheck ] && filter=() select=$INITCHECK_SELECT
  "$SAN" --tool "$tool" "${filter[@]}" --error-exitcode 9 --print-limit 20 --log-file "$OUT/$tool.log" \
    python3 -m pytest tests/test_ops_gpu.py tests/test_rotary_gpu.py tests/test_errors_gpu.py -m gpu -k "$select" \
    -p no:cacheprovider -q > "$OUT/$tool-pytest.log" 2>&1 &
  pids+=("$!:$tool")
done
status=0
for entry in "${pids[@]}"; do
  wait "${entry%%:*}"; rc=$?
  tool=${entry#*:}
  echo "$tool: exit $rc; $(grep -h 'SUMMARY' "$OUT/$tool.log" | tail -1); $(tail -1 "$OUT/$tool-pytest.log")" \
    | tee -a "$OUT/summary.txt"
  [ "$rc" = 0 ] || status=1
done
exit $status
