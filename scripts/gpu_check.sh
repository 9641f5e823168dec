#!/usr/bin/env bash
# The GPU half of verification, on a CUDA machine: the `gpu` test suite, scripts/sanitize.sh when
# SANITIZE=1, `kgen tune` for TUNE_OPS
# (default: none; the table lands in arch/tuning/ and in $OUT), then `kgen bench $BENCH_ARGS` for
# BENCH_OPS (default: every op, with SUMMARY.md), then `kgen bench --e2e` for each of E2E ("ltx ltx-train qwen3 qwen3-train";
# default: none). Everything lands in $OUT (default ./gpu-out): results.tgz holds
# the logs, the JUnit report and each op's bench JSON and Markdown table. Wheels for packages the
# machine lacks may be put in .whl/ (installed to /tmp/site, first on PYTHONPATH).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
RAW=${RAW:-$(mktemp -d)}  # RAW=$OUT/raw keeps partial logs if the run is cut short
mkdir -p "$OUT" "$RAW"
source scripts/device_env.sh "$RAW" || exit 1
cat "$RAW/device.txt"
export KGEN_TEST_BUILD_ROOT=${KGEN_TEST_BUILD_ROOT:-/tmp/kgen-build}
status=0
# Every op's local build at once (the test fixtures and the benchmark then find them up to date).
ARCH=$(python3 -c 'from kgen.builder import device_arch; print(device_arch())')
python3 -m kgen build --all --arch "$ARCH" --compile --jobs "${JOBS:-8}" --out "$KGEN_TEST_BUILD_ROOT" \
  > "$RAW/build.log" 2>&1 || { tail -50 "$RAW/build.log"; status=1; }
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  python3 -m pytest tests -m gpu -p no:cacheprovider -q -rfEs -o junit_family=xunit1 --junitxml="$RAW/gpu-junit.xml" ${PYTEST_ARGS:-} \
    2>&1 | tee "$RAW/gpu-tests.log" | grep -v "^DEBUG"
  status=${PIPESTATUS[0]}
fi
if [ "${SANITIZE:-0}" = 1 ]; then  # compute-sanitizer's four tools over the deterministic tests
  OUT="$RAW/sanitize" scripts/sanitize.sh || status=1
fi
for op in ${TUNE_OPS:-}; do
  python3 -m kgen tune "$op" --arch "$ARCH" --build-dir /tmp/kgen-tune 2>&1 | tee "$RAW/tune-$op.log"
  cp -r arch/tuning "$RAW/"
done
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  if [ -z "${BENCH_OPS:-}" ]; then
    python3 -m kgen bench --all ${BENCH_ARGS:-} --out "$RAW" --build-dir "$KGEN_TEST_BUILD_ROOT" 2>&1 | tee "$RAW/bench.log"
  fi
  for op in ${BENCH_OPS:-}; do
    python3 -m kgen bench "$op" ${BENCH_ARGS:-} --out "$RAW" --build-dir "$KGEN_TEST_BUILD_ROOT" 2>&1 | tee "$RAW/bench-$op.log"
  done
fi
for target in ${E2E:-}; do
  python3 -m kgen bench --e2e "$target" --out "$RAW" --build-dir "$KGEN_TEST_BUILD_ROOT" 2>&1 | tee "$RAW/e2e-$target.log"
done
tar czf "$OUT/results.tgz" -C "$RAW" .
exit $status
