"""qk_norm_rope3d against what the LTX-Video patch ran before it (kgen's rmsnorm on q, on k, then rope3d_qk)
and against diffusers' eager steps, at LTX-Video 2B's self-attention shapes: forward, and forward + backward
through autograd; implementations interleaved in rounds (kgen.bench.Timer), L2 flushed. Prints a markdown
table; bytes are the fused op's minimum (q, k read, out written: 2 × 2 × B·S·C elements)."""

import sys
from pathlib import Path

import torch

from kgen.bench import Timer
from kgen.builder import build_op, load
from kgen.catalog import load_spec

root = Path(sys.argv[1])
ops = {
    op: getattr(load(build_op(op, "sm_90", root)), op) for op in ("qk_norm_rope3d", "rmsnorm", "rope3d_qk")
}
peer = next(iter(load_spec("qk_norm_rope3d").peers.values()))
timer = Timer(torch, repeats=50)
print("| shape | pass | qk_norm_rope3d µs | rmsnorm ×2 + rope3d_qk µs | eager µs | fused GB/s | copy GB/s |")
print("|---|---|---|---|---|---|---|")
for batch, (frames, height, width) in ((2, (7, 16, 24)), (2, (21, 16, 24))):
    tokens, channels = frames * height * width, 2048
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    q, k = (torch.randn(batch, tokens, channels, generator=gen, device="cuda").bfloat16() for _ in range(2))
    wq, wk = ((1 + 0.1 * torch.randn(channels, generator=gen, device="cuda")).bfloat16() for _ in range(2))
    grid = (frames, height, width, 10000.0, 20.0, 2048.0, 2048.0, 8 / 25 * 8, 32.0, 32.0, 1.0, 1.0)
    eps = 1e-6
    fused = lambda q, k, wq, wk: ops["qk_norm_rope3d"](q, k, wq, wk, *grid, eps=eps)  # noqa: E731
    two = lambda q, k, wq, wk: ops["rope3d_qk"](ops["rmsnorm"](q, wq, eps), ops["rmsnorm"](k, wk, eps), *grid)  # noqa: E731
    eager = lambda q, k, wq, wk: peer(q, k, wq, wk, *grid, eps)  # noqa: E731
    a, b = fused(q, k, wq, wk), two(q, k, wq, wk)
    differ = sum(int((x != y).sum()) for x, y in zip(a, b))
    grads = [torch.randn_like(q) for _ in range(2)]
    leaves = [t.clone().requires_grad_() for t in (q, k, wq, wk)]

    def train(fn):
        return lambda: torch.autograd.grad(fn(*leaves), leaves, grads)

    fns = {
        "fused": lambda: fused(q, k, wq, wk),
        "two": lambda: two(q, k, wq, wk),
        "eager": lambda: eager(q, k, wq, wk),
    }
    fwd = {n: sorted(t)[len(t) // 2] for n, t in timer.rounds_us(fns, 5).items()}
    bwd = {
        n: sorted(t)[len(t) // 2]
        for n, t in timer.rounds_us({n: train(f) for n, f in zip(fns, (fused, two, eager))}, 3).items()
    }
    nbytes = 4 * batch * tokens * channels * 2
    copy = timer.copy_us(nbytes)
    shape = f"{batch}×{tokens}×{channels}"
    print(
        f"| {shape} | forward | {fwd['fused']:.1f} | {fwd['two']:.1f} | {fwd['eager']:.1f} | "
        f"{nbytes / fwd['fused'] / 1e3:.0f} | {nbytes / copy / 1e3:.0f} |"
    )
    print(
        f"| {shape} | forward + backward | {bwd['fused']:.1f} | {bwd['two']:.1f} | {bwd['eager']:.1f} | | |"
    )
    print(f"elements differing from rmsnorm + rope3d_qk at {shape}: {differ} of {a[0].numel() * 2}")
