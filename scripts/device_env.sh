# Sourced by the GPU scripts (scripts/gpu_check.sh, bench/results/*/job.sh) from the tree's root: the wheels
# the machine lacks ($WHEELS, default .whl/) installed to /tmp/site, the tree then /tmp/site on PYTHONPATH,
# unbuffered output; the GPU's name, driver, power limit and clocks (now and top) and torch's version in
# $1/device.txt; `done_ STEP RC` appends a line to $1/progress (what a lease's poll prints).
if compgen -G "${WHEELS:-.whl}/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "${WHEELS:-.whl}"/*.whl || return 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.sm,clocks.max.sm,clocks.mem --format=csv \
  > "$1/device.txt"
python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name())' >> "$1/device.txt"
KGEN_PROGRESS="$1/progress"
done_() { echo "$1 rc=$2 $(date)" >> "$KGEN_PROGRESS"; }
