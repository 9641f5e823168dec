"""The fused q/k norm + rotation before ("base": two heads in flight, each thread holding both tensors'
norm weights; 86-96 registers) and after ("new": one head in flight, the weights read per head; 64 registers
for the bf16 vector kernel), interleaved in one process at Flux.1-dev's and Wan 2.1's attention shapes, with
kgen bench's timer (CUDA events, L2 flushed, median of 100 runs, 3 interleaved rounds) and a same-size copy;
outputs compared bitwise. q and k are [B, H, S, D] views of [B, S, H, D] heads, as the integrations pass
them. Run after `kgen build qk_norm_rope_flux qk_norm_rope_wan --arch sm_90 --compile --out DIR` from each
version: python variants.py BASE NEW"""

import statistics
import sys
from pathlib import Path

import torch

from kgen.bench import Timer
from kgen.builder import load

VARIANTS = {"base": Path(sys.argv[1]), "new": Path(sys.argv[2])}


def op(root, name):
    return getattr(load(root / f"{name.replace('_', '-')}-sm90"), name)


kern = {v: (op(r, "qk_norm_rope_flux"), op(r, "qk_norm_rope_wan")) for v, r in VARIANTS.items()}
timer = Timer(torch, repeats=100)
gen = torch.Generator(device="cuda").manual_seed(0)
dims_wan = dict(frames=21, height=30, width=52, theta=10000.0, dim_t=44, dim_h=42, dim_w=42)
print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
print(
    "| workload | q, k shape | MB moved | base µs | new µs | base / new | % of same-size copy (base, new) "
    "| bitwise |"
)
print("|---|---|---|---|---|---|---|---|")
for name, heads, tokens in (
    ("Flux.1-dev", 24, 4608),
    ("Wan 2.1 1.3B", 12, 32760),
    ("Wan 2.1 14B", 40, 32760),
):
    q, k = (
        torch.randn(1, tokens, heads, 128, generator=gen, device="cuda").bfloat16().transpose(1, 2)
        for _ in range(2)
    )
    if name.startswith("Flux"):
        wq, wk = (torch.rand(128, generator=gen, device="cuda").bfloat16() + 0.5 for _ in range(2))
        positions = (torch.rand(1, 3, tokens, generator=gen, device="cuda") * 64).round()
        fns = {v: (lambda f=f[0]: f(q, k, wq, wk, positions)) for v, f in kern.items()}
    else:
        wq, wk = (torch.rand(heads * 128, generator=gen, device="cuda").bfloat16() + 0.5 for _ in range(2))
        fns = {v: (lambda f=f[1]: f(q, k, wq, wk, **dims_wan)) for v, f in kern.items()}
    same = all(torch.equal(a, b) for a, b in zip(fns["base"](), fns["new"]()))
    per = timer.rounds_us(fns, 3)
    med = {v: statistics.median(t) for v, t in per.items()}
    traffic = 2 * 2 * q.numel() * 2  # q and k read once, written once
    copy = timer.copy_us(traffic)
    print(
        f"| {name} | {tuple(q.shape)} | {traffic / 1e6:.1f} | {med['base']:.1f} | {med['new']:.1f} | "
        f"{med['base'] / med['new']:.2f} | {100 * copy / med['base']:.0f}, {100 * copy / med['new']:.0f} "
        f"| {same} |",
        flush=True,
    )
