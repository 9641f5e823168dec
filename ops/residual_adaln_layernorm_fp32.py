"""Wan 2.x's residual step fused with the next AdaLN over an FP32LayerNorm: r = x + h · gate in fp32 with a
float32 gate (optional: Wan's cross-attention residual has none), rounded once to x's dtype; y =
layernorm(r) · (1 + scale) + shift in fp32 with float32 scale and shift, rounded once; returns (y, r).

Order: reference, the implementations it replaces, then the spec.
"""

import sympy as sp
import torch
import torch.nn.functional as F

from kgen.dsl import Convention, OpSpec, Param, Tensor, inv_hidden, to_io_dtype
from kgen.families.row_reduce import Reduction, RowReduce, row_sum

x, h, scale, shift, gate, eps, mean, rstd, residual_out = sp.symbols(
    "x h scale shift gate eps mean rstd residual_out"
)


def residual_adaln_layernorm_fp32_ref(
    x: torch.Tensor,
    h: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    gate: torch.Tensor | None = None,
    eps: float = 1e-6,
):
    """float64 reference: (out, residual_out), residual_out rounded to x's dtype first."""
    update = h.double() if gate is None else h.double() * gate.double()
    r = (x.double() + update).to(x.dtype).double()
    return F.layer_norm(r, r.shape[-1:], eps=eps) * (1 + scale.double()) + shift.double(), r


def wan_residual_modulation(
    x: torch.Tensor,
    h: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    gate: torch.Tensor | None = None,
    eps: float = 1e-6,
):
    """Wan's block: `(x.float() + h.float() * gate).type_as(x)` (or `x + h`), then FP32LayerNorm and the fp32
    modulation."""
    r = x + h if gate is None else (x.float() + h.float() * gate).type_as(x)
    return (F.layer_norm(r.float(), r.shape[-1:], eps=eps) * (1 + scale) + shift).type_as(x), r


spec = OpSpec(
    name="residual_adaln_layernorm_fp32",
    summary="gated residual add in fp32, then FP32LayerNorm (no affine) with float32 (1 + scale) and shift "
    "modulation, returning both (Wan)",
    tensors=[
        Tensor(name="x", dims="*rows hidden", doc="the residual stream [B, S, C]"),
        Tensor(name="h", dims="*rows hidden", doc="the sublayer's output, same shape as x"),
        Tensor(
            name="scale", dims="*rows hidden", dtype="float32", broadcast=True, doc="[B, 1, C] or [B, S, C]"
        ),
        Tensor(
            name="shift", dims="*rows hidden", dtype="float32", broadcast=True, doc="[B, 1, C] or [B, S, C]"
        ),
        Tensor(
            name="gate",
            dims="*rows hidden",
            dtype="float32",
            broadcast=True,
            optional=True,
            absent_value=1.0,
            doc="[B, 1, C] or [B, S, C], or None",
        ),
        Tensor(name="out", dims="*rows hidden", role="output"),
        Tensor(name="residual_out", dims="*rows hidden", role="output"),
    ],
    params=[Param(name="eps", default=1e-6, positive=True, doc="added to the variance")],
    structure=RowReduce(
        prologue={"residual_out": to_io_dtype(x + h * gate)},
        reductions=[
            Reduction(stat="mean", summand=residual_out, finalize=row_sum * inv_hidden),
            Reduction(
                stat="rstd",
                summand=(residual_out - mean) ** 2,
                finalize=1 / sp.sqrt(row_sum * inv_hidden + eps),
            ),
        ],
        conventions=[
            Convention(
                name="single_rounding",
                outputs={
                    "out": (residual_out - mean) * rstd * (1 + scale) + shift,
                    "residual_out": residual_out,
                },
                matches="Wan: r = x + h·gate in fp32 rounded once (as stored), FP32LayerNorm and the fp32 "
                "modulation rounded once",
            ),
        ],
    ),
    reference=residual_adaln_layernorm_fp32_ref,
    peers={"eager (Wan: fp32 gated residual + FP32LayerNorm + fp32 modulation)": wan_residual_modulation},
)
