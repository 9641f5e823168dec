"""Does attention run slower on kgen's q/k layout? Qwen3-8B's prefill attention at 1×2048 tokens (q 32 heads,
k and v 8, head size 128, bf16) timed with q and k as transformers' rotation leaves them (contiguous
[B, H, T, D]) and as kgen's qk_norm_rope leaves them (its input's layout: a [B, T, H, D] tensor seen through
transpose(1, 2)); v is such a view in both (v_proj's output, transposed). Each with transformers' two GQA
forms (repeat_kv, then one head per query head; enable_gqa) and both mask forms (is_causal; a boolean causal
mask as transformers builds under torch.compile), eager and compiled. CUDA events, L2 flushed, median of 100
runs; then the kernels of one call of each layout under torch.profiler. Usage: attention_layout.py OUT.md"""

import sys

import torch
import torch.nn.functional as F

B, T, HQ, HKV, D = 1, 2048, 32, 8, 128
dev, dt = "cuda", torch.bfloat16
flush = torch.empty(256 * 2**20, dtype=torch.uint8, device=dev)


def median_us(fn, repeats=100):
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeats):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000)
    return sorted(times)[len(times) // 2]


def inputs(layout):
    q = torch.randn(B, T, HQ, D, device=dev, dtype=dt).transpose(1, 2)
    k = torch.randn(B, T, HKV, D, device=dev, dtype=dt).transpose(1, 2)
    v = torch.randn(B, T, HKV, D, device=dev, dtype=dt).transpose(1, 2)
    if layout == "transformers (q, k contiguous)":
        q, k = q.contiguous(), k.contiguous()
    return q, k, v


def attention(gqa, masked):
    mask = torch.ones(T, T, dtype=torch.bool, device=dev).tril()[None, None] if masked else None

    def run(q, k, v):
        if gqa == "repeat_kv":
            k = k[:, :, None].expand(B, HKV, HQ // HKV, T, D).reshape(B, HQ, T, D)
            v = v[:, :, None].expand(B, HKV, HQ // HKV, T, D).reshape(B, HQ, T, D)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=True
        )

    return run


layouts = ("transformers (q, k contiguous)", "kgen (q, k as [B, T, H, D] viewed)")
lines = [
    f"{torch.cuda.get_device_name()}, torch {torch.__version__}; q [{B}, {HQ}, {T}, {D}], "
    f"k, v [{B}, {HKV}, {T}, {D}], bf16; CUDA events, L2 flushed, median of 100 runs (µs)",
    "",
    "| GQA | mask | mode | " + " | ".join(layouts) + " | kgen / transformers |",
    "|---|---|---|---|---|---|",
]
for gqa in ("repeat_kv", "enable_gqa"):
    for masked in (False, True):
        for mode in ("eager", "torch.compile"):
            fn = attention(gqa, masked)
            if mode == "torch.compile":
                torch._dynamo.reset()
                fn = torch.compile(fn, dynamic=False)
            times = []
            for lay in layouts:
                args = inputs(lay)
                times.append(median_us(lambda: fn(*args)))  # noqa: B023 (called before args changes)
            lines.append(
                f"| {gqa} | {'boolean causal' if masked else 'is_causal'} | {mode} | "
                + " | ".join(f"{t:.1f}" for t in times)
                + f" | {times[1] / times[0]:.2f} |"
            )
            print(lines[-1], flush=True)
for lay in layouts:
    fn, args = attention("repeat_kv", True), inputs(lay)
    fn(*args)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn(*args)
        torch.cuda.synchronize()
    lines += [
        "",
        f"kernels of one eager call, repeat_kv, boolean mask, {lay}:",
        "",
        "| kernel | µs |",
        "|---|---|",
    ]
    lines += [f"| `{e.key[:100]}` | {e.device_time_total:.1f} |" for e in prof.key_averages()]
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
