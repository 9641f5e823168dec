"""Rotary embedding from fp32 cos/sin tables on interleaved pairs (2i, 2i + 1): diffusers'
`apply_rotary_emb` of LTX-Video (and the Flux form), for any tables; x [B, S, C] (or a 4-D
[B, H, S, D]), cos and sin [B or 1, S, C] in float32. Computed in fp32, rounded once, as diffusers does.

Order: reference, the implementations it replaces, then the spec.
"""

import sympy as sp
import torch

from kgen.dsl import Convention, OpSpec, Tensor
from kgen.families.rotary import Rotary, cos, sign, sin

x, x_pair = sp.symbols("x x_pair")


def rope_apply_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """float64 reference."""
    if x.dim() == 4 and cos.dim() == 3:
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    pairs = x.double().unflatten(-1, (-1, 2))
    rotated = torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)
    return x.double() * cos.double() + rotated * sin.double()


def diffusers_apply_rotary_emb(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """diffusers' LTX-Video apply_rotary_emb(x, (cos, sin))."""
    x_real, x_imag = x.unflatten(2, (-1, 2)).unbind(-1)
    x_rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(2)
    return (x.float() * cos + x_rotated.float() * sin).to(x.dtype)


spec = OpSpec(
    name="rope_apply",
    summary="rotary embedding from fp32 cos/sin tables, interleaved pairs (diffusers apply_rotary_emb)",
    tensors=[
        Tensor(name="x", dims="*rows hidden", doc="[B, S, C] (q or k before the head split) or [B, H, S, D]"),
        Tensor(
            name="cos", dims="*rows hidden", dtype="float32", broadcast=True, doc="[B or 1, S, C] float32"
        ),
        Tensor(
            name="sin", dims="*rows hidden", dtype="float32", broadcast=True, doc="[B or 1, S, C] float32"
        ),
        Tensor(name="out", dims="*rows hidden", role="output"),
    ],
    structure=Rotary(
        pairing="interleaved",
        rotates=["x"],
        tables=("cos", "sin"),
        conventions=[
            Convention(
                name="single_rounding",
                outputs={"out": x * cos + sign * x_pair * sin},
                matches="diffusers apply_rotary_emb: fp32 math, one rounding",
            ),
        ],
    ),
    reference=rope_apply_ref,
    peers={"eager (diffusers apply_rotary_emb)": diffusers_apply_rotary_emb},
)
