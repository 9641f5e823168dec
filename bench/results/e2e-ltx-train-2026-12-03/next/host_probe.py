"""Host time per call of kgen's ops, forward and derived backward, as torch.compile's wrapper calls them
(`torch.ops.<library>.<op>` with no autograd recorded), next to ATen calls of the same size: an add,
F.rms_norm and its backward. Small tensors (8 rows), so the GPU never holds the host back: 3 000 calls
back to back, no synchronisation inside, host µs per call = wall time / calls; median of 5 repeats. Also:
the same calls under torch.profiler, CPU time by operator (where the host time goes: dispatcher, binding,
allocations).

`python host_probe.py BUILD_ROOT [OPS]` (OPS: a comma list; default the ops of the Qwen3 and LTX-Video
training steps). Prints JSON lines, one per (op, call)."""

import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from kgen.bench import example_inputs
from kgen.builder import build_op, device_arch, load
from kgen.catalog import backward_spec, load_spec

CALLS, REPEATS = 3000, 5
root = Path(sys.argv[1])
ops = (
    sys.argv[2]
    if len(sys.argv) > 2
    else "rmsnorm,silu_mul,rope,adaln_rmsnorm,residual_adaln_rmsnorm,rope3d_qk,gelu_tanh"
).split(",")


def host_us(fn) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        for _ in range(CALLS):
            fn()
        times.append((time.perf_counter() - start) / CALLS * 1e6)
        torch.cuda.synchronize()
    return statistics.median(times)


def line(**row):
    print(json.dumps(row), flush=True)


x = torch.randn(8, 4096, device="cuda", dtype=torch.bfloat16)
w = torch.ones(4096, device="cuda", dtype=torch.bfloat16)
with torch.no_grad():
    line(op="aten", call="add", host_us=host_us(lambda: x + x))
    line(op="aten", call="rms_norm", host_us=host_us(lambda: F.rms_norm(x, (4096,), w, 1e-6)))
xr = x.clone().requires_grad_()
y = F.rms_norm(xr, (4096,), w, 1e-6)
dy = torch.randn_like(y)
line(
    op="aten",
    call="rms_norm autograd backward",
    host_us=host_us(lambda: torch.autograd.grad(y, xr, dy, retain_graph=True)),
)

arch = device_arch()
for op in ops:
    spec, back = load_spec(op), backward_spec(op)
    library = load(build_op(op, arch, root))
    shape, params = (8, 4096), [p.default for p in spec.params]
    if spec.structure.kind == "rotary":
        grid = spec.structure.grid
        sizes = dict(zip(grid.sizes, (1, 2, 4))) if grid is not None and grid.sizes else {}
        shape = (2, 8, 128) if sizes else (1, 2, 8, 128)  # LTX-Video's [B, S, C]; transformers' [B, H, T, D]
        params = [sizes.get(p.name, p.default) for p in spec.params]
    inputs = example_inputs(spec, shape, torch.bfloat16)
    forward = getattr(library.ops, op)
    with torch.no_grad():
        line(op=op, call="forward", host_us=host_us(lambda: forward(*inputs, *params)))
        outs = forward(*inputs, *params)
        outs = outs if isinstance(outs, tuple) else (outs,)
        if back is not None:
            named = {t.name: v for t, v in zip(spec.inputs, inputs)}
            named |= {f"grad_{t.name}": torch.randn_like(o) for t, o in zip(spec.outputs, outs)}
            args = [named[t.name] for t in back.inputs]
            backward = getattr(library.ops, back.name)
            line(op=op, call="backward", host_us=host_us(lambda: backward(*args, *params)))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof, torch.no_grad():
        for _ in range(200):
            forward(*inputs, *params)
            if back is not None:
                backward(*args, *params)
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12)
    line(op=op, call="profile", table=table)
