"""One Qwen3-8B decode step's attention (batch 64, 32 query heads on 8 k/v heads, head size 128, a static
cache of 512 + 64 keys, the last 63 masked), bf16: SDPA on the grouped heads (kgen.integrations.attention)
against SDPA on k and v copied out to every head (transformers' repeat_kv, what a decode step runs on
transformers 5.17): whether the outputs are bitwise equal, the largest difference, each one's error against
float64, and each one's time (CUDA events, L2 flushed, median of 50), eager and under torch.compile."""

import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import repeat_kv

from kgen.bench import Timer
from kgen.integrations.attention import _attend_grouped

batch, heads, kv_heads, keys, dim = 64, 32, 8, 576, 128
torch.manual_seed(0)
q = torch.randn(batch, 1, heads, dim, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
k, v = (torch.randn(batch, kv_heads, keys, dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
mask = torch.ones(batch, 1, 1, keys, device="cuda", dtype=torch.bool)
mask[..., 513:] = False
attention = type("Attention", (), {"scaling": dim**-0.5})


def copied(q, k, v):
    groups = heads // kv_heads
    out = F.scaled_dot_product_attention(
        q, repeat_kv(k, groups), repeat_kv(v, groups), attn_mask=mask, scale=attention.scaling
    )
    return out.transpose(1, 2)


def grouped(q, k, v):
    return _attend_grouped(attention, q, k, v, mask)


got, want = grouped(q, k, v), copied(q, k, v)
truth = copied(q.double(), k.double(), v.double())
print(f"bitwise equal: {torch.equal(got, want)}; largest difference {(got - want).abs().max().item():.3e}")
print(
    f"error against float64: grouped {(got.double() - truth).abs().max().item():.3e}, "
    f"copied {(want.double() - truth).abs().max().item():.3e}"
)
timer = Timer(torch, repeats=50)
for name, fn in (("copied", copied), ("grouped", grouped)):
    compiled = torch.compile(fn, dynamic=False)
    compiled(q, k, v)
    eager_us = timer.median_us(lambda: fn(q, k, v))
    compiled_us = timer.median_us(lambda: compiled(q, k, v))
    same = torch.equal(compiled(q, k, v), want)
    print(f"{name}: eager {eager_us:.1f} µs, torch.compile {compiled_us:.1f} µs", end=" ")
    print(f"(compiled output bitwise the copy's: {same})")
