#!/usr/bin/env bash
# Downloads, on a machine with pip access, the wheels a GPU machine without them needs to run kgen's GPU scripts
# (scripts/gpu_check.sh, bench/results/*/job.sh: scripts/device_env.sh installs $WHEELS, default .whl/, there):
# what kgen imports beyond torch, jinja2, sympy, transformers and numpy, at the versions CI tests, for the GPU
# machine's Python ($PYTHON_VERSION, default 3.12) on x86-64 Linux. No dependencies are fetched: the list
# names each one that such a machine lacked.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${WHEELS:-.whl}
WANTED=(
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5  # spec validation
  kernels==0.17.2 tomlkit==0.15.3  # loading the builds
  diffusers==0.42.1 importlib-metadata==10.2.0  # the LTX-Video, Flux.1 and Wan integrations
  liger-kernel==0.8.5  # a benchmark peer
)
mkdir -p "$DEST"
for wheel in "${WANTED[@]}"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "${PYTHON_VERSION:-3.12}" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$DEST" "$wheel"
done
ls "$DEST"
