"""Wan 2.x's self-attention residual fused with its cross-attention norm (norm2, an FP32LayerNorm with
affine): r = x + h · gate in fp32 with a float32 gate, rounded once to x's dtype; y = layernorm(r) · weight +
bias in fp32 with float32 weight and bias (Wan keeps norm2 in fp32), rounded once; returns (y, r).

Order: reference, the implementations it replaces, then the spec.
"""

import sympy as sp
import torch
import torch.nn.functional as F

from kgen.dsl import Convention, OpSpec, Param, Tensor, inv_hidden, to_io_dtype
from kgen.families.row_reduce import Reduction, RowReduce, row_sum

x, h, gate, weight, bias, eps, mean, rstd, residual_out = sp.symbols(
    "x h gate weight bias eps mean rstd residual_out"
)


def residual_layernorm_fp32_ref(
    x: torch.Tensor,
    h: torch.Tensor,
    gate: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-6,
):
    """float64 reference: (out, residual_out), residual_out rounded to x's dtype first."""
    r = (x.double() + h.double() * gate.double()).to(x.dtype).double()
    w, b = (None if t is None else t.double() for t in (weight, bias))
    return F.layer_norm(r, r.shape[-1:], w, b, eps=eps), r


def wan_residual_norm(
    x: torch.Tensor,
    h: torch.Tensor,
    gate: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-6,
):
    """Wan's block: `(x.float() + h * gate).type_as(x)`, then norm2 (FP32LayerNorm with its fp32 weight and
    bias) of r.float(), `.type_as(x)`."""
    r = (x.float() + h * gate).type_as(x)
    return F.layer_norm(r.float(), r.shape[-1:], weight, bias, eps).type_as(x), r


spec = OpSpec(
    name="residual_layernorm_fp32",
    summary="gated residual add in fp32, then FP32LayerNorm with float32 weight and bias, returning both "
    "(Wan)",
    tensors=[
        Tensor(name="x", dims="*rows hidden", doc="the residual stream [B, S, C]"),
        Tensor(name="h", dims="*rows hidden", doc="the sublayer's output, same shape as x"),
        Tensor(
            name="gate", dims="*rows hidden", dtype="float32", broadcast=True, doc="[B, 1, C] or [B, S, C]"
        ),
        Tensor(
            name="weight",
            dims="hidden",
            dtype="float32",
            optional=True,
            absent_value=1.0,
            doc="norm2.weight (float32), or None",
        ),
        Tensor(
            name="bias",
            dims="hidden",
            dtype="float32",
            optional=True,
            absent_value=0.0,
            doc="norm2.bias (float32), or None",
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
                outputs={"out": (residual_out - mean) * rstd * weight + bias, "residual_out": residual_out},
                matches="Wan: r = x + h·gate in fp32 rounded once (as stored), FP32LayerNorm with its fp32 "
                "affine rounded once",
            ),
        ],
    ),
    reference=residual_layernorm_fp32_ref,
    peers={"eager (Wan: fp32 gated residual + FP32LayerNorm with affine)": wan_residual_norm},
)
