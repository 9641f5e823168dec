"""Qwen3's q/k RMSNorm over each head (`Qwen3RMSNorm(head_dim)`: an attention's q_norm and k_norm) and
transformers' `apply_rotary_pos_emb` (rotate_half pairs, cos and sin tables in the model dtype) in one pass:
q and k read once and written once, instead of twice each, as torch.compile's own fused kernel does. The norm
rounds as Qwen3RMSNorm (the normed value to the dtype, then the weight), then the rotation as transformers
(each product in the model dtype, then the sum). Its backward is derived: the rotation by -θ of the incoming
gradients, then the norm's backward.

Order: reference, the implementations it replaces, then the spec.
"""

import sympy as sp
import torch

from kgen.catalog import load_spec
from kgen.dsl import Convention, OpSpec, Param, Tensor, to_io_dtype
from kgen.families.rotary import Rotary, RotaryNorm, cos, inv_count, row_sum, rstd, sign, sin, weight

ROPE = load_spec("rope")
rope_ref = ROPE.reference
transformers_apply_rotary_pos_emb = next(iter(ROPE.peers.values()))
rmsnorm_ref = load_spec("rmsnorm").reference  # float64 x · rsqrt(mean(x²) + eps) · weight over the last dim
x, x_pair, k, k_pair, eps = sp.symbols("x x_pair k k_pair eps")


def qk_norm_rope_ref(x, k, x_weight, k_weight, cos, sin, eps=1e-6, convention="transformers"):
    """q and k normalized as Qwen3RMSNorm outputs them (rounded to their dtype), then rotated as the
    reference of rope (transformers' roundings)."""
    normed = (
        rmsnorm_ref(x, x_weight, eps, convention="transformers").to(x.dtype),
        rmsnorm_ref(k, k_weight, eps, convention="transformers").to(k.dtype),
    )
    return rope_ref(*normed, cos, sin, convention=convention)


def qwen3_qk_norm_rope(x, k, x_weight, k_weight, cos, sin, eps):
    """What Qwen3Attention runs: q_norm and k_norm (Qwen3RMSNorm's math), then apply_rotary_pos_emb."""

    def norm(t, w):
        t32 = t.float()
        return w * (t32 * torch.rsqrt(t32.pow(2).mean(-1, keepdim=True) + eps)).to(t.dtype)

    return transformers_apply_rotary_pos_emb(norm(x, x_weight), norm(k, k_weight), cos, sin)


spec = OpSpec(
    name="qk_norm_rope",
    summary="Qwen3 q/k RMSNorm over each head and rotary embedding (rotate_half, cos/sin tables) in one pass",
    tensors=[
        Tensor(name="x", dims="*rows hidden", doc="q: [B, Hq, T, D] before its norm"),
        Tensor(name="k", dims="*rows hidden", doc="k: [B, Hkv, T, D] before its norm"),
        Tensor(name="x_weight", dims="hidden", doc="q_norm's weight [D]"),
        Tensor(name="k_weight", dims="hidden", doc="k_norm's weight [D]"),
        Tensor(name="cos", dims="*rows hidden", broadcast=True, doc="[B or 1, T, D], the model dtype"),
        Tensor(name="sin", dims="*rows hidden", broadcast=True, doc="[B or 1, T, D], the model dtype"),
        Tensor(name="out", dims="*rows hidden", role="output"),
        Tensor(name="k_out", dims="*rows hidden", role="output"),
    ],
    params=[Param(name="eps", default=1e-6, positive=True, doc="the norms' eps")],
    structure=Rotary(
        pairing="half",
        rotates=["x", "k"],
        tables=("cos", "sin"),
        norm=RotaryNorm(
            over="head",
            weights=["x_weight", "k_weight"],
            summand=x**2,
            finalize=1 / sp.sqrt(row_sum * inv_count + eps),
            normed=to_io_dtype(weight * to_io_dtype(x * rstd)),
        ),
        conventions=[
            Convention(
                name="transformers",
                outputs={
                    "out": to_io_dtype(x * cos) + to_io_dtype(sign * x_pair * sin),
                    "k_out": to_io_dtype(k * cos) + to_io_dtype(sign * k_pair * sin),
                },
                matches="Qwen3Attention: q_norm / k_norm (Qwen3RMSNorm), then apply_rotary_pos_emb",
            ),
        ],
    ),
    reference=qk_norm_rope_ref,
    peers={"eager (Qwen3RMSNorm, then transformers apply_rotary_pos_emb)": qwen3_qk_norm_rope},
)
