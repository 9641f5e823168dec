"""The fused q/k norm + rotation against the two kgen ops it replaces (rmsnorm on q and on k, then rope_flux /
rope_wan), at Flux.1-dev's and Wan 2.1's attention shapes, with kgen bench's timer (CUDA events, L2 flushed,
median of 100 runs, 3 interleaved rounds). q and k are [B, H, S, D] views of [B, S, H, D] heads, as the
integrations pass them. Run on the GPU after `kgen build ... --compile --out $BUILD`:
python bench/results/qk-norm-rope-2026-12-03/two_ops.py $BUILD"""

import statistics
import sys
from pathlib import Path

import torch
from kernels import get_local_kernel

from kgen.bench import Timer

BUILD = Path(sys.argv[1])


def op(name):
    return getattr(get_local_kernel(BUILD / f"{name.replace('_', '-')}-sm90"), name)


fused_flux, fused_wan = op("qk_norm_rope_flux"), op("qk_norm_rope_wan")
rmsnorm, rope_flux, rope_wan = op("rmsnorm"), op("rope_flux"), op("rope_wan")
timer = Timer(torch, repeats=100)
gen = torch.Generator(device="cuda").manual_seed(0)
dims_wan = dict(frames=21, height=30, width=52, theta=10000.0, dim_t=44, dim_h=42, dim_w=42)
rows = []
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
        fused = lambda: fused_flux(q, k, wq, wk, positions)  # noqa: E731
        two = lambda: rope_flux(rmsnorm(q, wq, 1e-6), rmsnorm(k, wk, 1e-6), positions)  # noqa: E731
    else:
        wq, wk = (torch.rand(heads * 128, generator=gen, device="cuda").bfloat16() + 0.5 for _ in range(2))

        def across(t, w):  # the norm over [B, S, H·D], as the model's norm_q sees the projection
            return rmsnorm(t.transpose(1, 2).flatten(2), w, 1e-6).unflatten(2, (heads, 128)).transpose(1, 2)

        fused = lambda: fused_wan(q, k, wq, wk, **dims_wan)  # noqa: E731
        two = lambda: rope_wan(across(q, wq), across(k, wk), **dims_wan)  # noqa: E731
    for a, b in zip(fused(), two()):
        assert (a != b).float().mean() < 1e-3
    rounds = [(timer.median_us(fused), timer.median_us(two)) for _ in range(3)]
    f, t = (statistics.median(r[i] for r in rounds) for i in (0, 1))
    traffic = 2 * 2 * q.numel() * 2  # q and k read once, written once
    copy = timer.copy_us(traffic)
    rows.append(
        f"| {name} | {tuple(q.shape)} | {traffic / 1e6:.1f} | {f:.1f} | {t:.1f} | {t / f:.2f} | "
        f"{traffic / f / 1e3:.0f} | {100 * copy / f:.0f} |"
    )
print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
print(
    "| workload | q, k shape | MB moved (fused) | fused µs | rmsnorm ×2 + rope µs | two ops / fused "
    "| fused GB/s | % of same-size copy |"
)
print("|---|---|---|---|---|---|---|---|")
print("\n".join(rows))
