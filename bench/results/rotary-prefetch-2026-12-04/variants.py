"""The rotary family's kernels before ("base": each head's accesses converted to fp32 as loaded, one head in
flight for rotate_half pairs and a norm over each head) and after ("new": a head's accesses held as loaded
until its math, the next head's loads issued before it), interleaved in one process: every rotary op's forward
and derived backward at its largest suite shape, with kgen bench's timer (CUDA events, L2 flushed, median of
100 runs, 3 interleaved rounds) and a same-size copy; outputs compared bitwise. The backward op is called
directly (no autograd). Run after `kgen build OPS --arch sm_90 --compile --out DIR` from each version:
python variants.py BASE NEW"""

import math
import statistics
import sys
from pathlib import Path

import torch

from kgen.bench import Timer, example_inputs
from kgen.builder import load
from kgen.catalog import backward_spec, load_spec, op_names, suite

VARIANTS = {"base": Path(sys.argv[1]), "new": Path(sys.argv[2])}
OPS = [op for op in op_names() if load_spec(op).structure.kind == "rotary"]


def library(root, op):
    return load(root / f"{op.replace('_', '-')}-sm90")


def traffic(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


timer = Timer(torch, repeats=100)
print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, bf16")
print(
    "| op | pass | shape | MB moved | base µs | new µs | base / new | % of same-size copy (base, new) ",
    end="",
)
print("| bitwise |")
print("|---|---|---|---|---|---|---|---|---|")
for op in OPS:
    case = max(suite(op), key=lambda c: math.prod(c.shape))  # the largest suite shape
    libs = {v: library(r, op) for v, r in VARIANTS.items()}
    for direction in ("forward", "backward"):
        spec = load_spec(op) if direction == "forward" else backward_spec(op)
        if spec is None:
            continue
        gen = torch.Generator(device="cuda").manual_seed(0)
        inputs = example_inputs(
            spec, case.shape, torch.bfloat16, per_batch=case.per_batch, k_heads=case.k_heads, generator=gen
        )
        params = case.param_values(spec)
        ops = {v: getattr(lib._ops.ops, spec.name) for v, lib in libs.items()}
        fns = {v: (lambda f=f: f(*inputs, *params)) for v, f in ops.items()}
        outs = {v: fn() for v, fn in fns.items()}
        same = all(torch.equal(a, b) for a, b in zip(outs["base"], outs["new"]))
        moved = traffic(inputs) + traffic(outs["new"])
        per = timer.rounds_us(fns, 3)
        med = {v: statistics.median(t) for v, t in per.items()}
        copy = timer.copy_us(moved)
        print(
            f"| {op} | {direction} | {'×'.join(map(str, case.shape))} | {moved / 1e6:.1f} | "
            f"{med['base']:.1f} | {med['new']:.1f} | {med['base'] / med['new']:.2f} | "
            f"{100 * copy / med['base']:.0f}, "
            f"{100 * copy / med['new']:.0f} | {same} |",
            flush=True,
        )
