"""Which calls make the copies of a training step (`python copies_probe.py TARGET BUILD_ROOT`, TARGET as
for `kgen bench --e2e`): one profiled step of torch.compile + kgen and of eager + kgen, each aten::copy_ /
clone / contiguous / reshape with a CUDA kernel, its CPU ancestors and input shapes."""

import sys
from collections import Counter
from pathlib import Path

import torch

from kgen.integrations.workloads import BUILDERS

target, root = sys.argv[1], Path(sys.argv[2])
models, workloads = BUILDERS[target](torch, "cuda", None, dict(root=root, arch=None, step=print), 10, print)
step = next(iter(workloads.values()))
for variant in ("torch.compile + kgen", "eager + kgen"):
    m = (
        torch.compile(models["eager + kgen"])
        if variant.startswith("torch.compile")
        else models["eager + kgen"]
    )
    for _ in range(3):
        step(m)
    torch.cuda.synchronize()
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
        record_shapes=True,
    ) as prof:
        step(m)
        torch.cuda.synchronize()
    found = Counter()
    for e in prof.events():
        if e.name not in (
            "aten::copy_",
            "aten::clone",
            "aten::contiguous",
            "aten::reshape",
            "aten::_to_copy",
        ):
            continue
        kernels = [k.name for k in e.kernels]
        if not any("copy" in k for k in kernels):
            continue
        chain, p = [], e.cpu_parent
        while p is not None and len(chain) < 6:
            chain.append(p.name)
            p = p.cpu_parent
        found[(e.name, str(e.input_shapes)[:120], " < ".join(chain)[:300])] += 1
    print(f"== {variant}: copies with a CUDA kernel (call, input shapes, ancestors): count")
    for (name, shapes, chain), n in found.most_common(30):
        print(f"{n:3d} {name} {shapes}\n      {chain}")
