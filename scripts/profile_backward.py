"""Where silu_mul's forward + backward spends GPU and host time under autograd, kgen against eager: the
torch.profiler kernel table and back-to-back event timing. Run on a GPU after
`kgen build silu_mul --arch sm_90 --compile --out $KGEN_BUILD_ROOT` (default /tmp/kb)."""

import os
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from kgen.builder import load
from kgen.catalog import load_spec

lib = load(Path(os.environ.get("KGEN_BUILD_ROOT", "/tmp/kb")) / "silu-mul-sm90")
spec = load_spec("silu_mul")
eager = next(iter(spec.peers.values()))
for shape in [(8192, 14336), (64, 14336)]:
    for name, fn in [("kgen", lib.silu_mul), ("eager", eager)]:
        x, up = (torch.randn(shape, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(2))
        dy = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        for _ in range(3):
            torch.autograd.grad(fn(x, up), [x, up], dy)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                torch.autograd.grad(fn(x, up), [x, up], dy)
            torch.cuda.synchronize()
        print(f"==== {name} {shape}")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=70))
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            torch.autograd.grad(fn(x, up), [x, up], dy)
        end.record()
        torch.cuda.synchronize()
        print(f"{name} {shape}: {start.elapsed_time(end) / 20 * 1e3:.1f} us per fwd+bwd, back to back")
