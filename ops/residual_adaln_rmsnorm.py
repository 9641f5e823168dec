"""The residual step of a DiT block fused with the next AdaLN-RMSNorm: r = x + h · gate (gate
optional), y = rmsnorm(r) · (1 + scale) + shift; returns (y, r) in one pass. In LTX-Video,
`hidden_states + attn2_output` then norm2 with the MLP modulation (no gate), and
`hidden_states + ff_output * gate_mlp` then the next block's norm1.

Order: reference, the implementations it replaces, then the spec.
"""

import sympy as sp
import torch

from kgen.dsl import Convention, OpSpec, Param, Tensor, inv_hidden, to_io_dtype
from kgen.families.row_reduce import Reduction, RowReduce, row_sum

x, h, scale, shift, gate, weight, eps, rstd, residual_out = sp.symbols(
    "x h scale shift gate weight eps rstd residual_out"
)


def residual_adaln_rmsnorm_ref(
    x: torch.Tensor,
    h: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    gate: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    convention: str = "single_rounding",
):
    """float64 reference: (out, residual_out), residual_out rounded to x's dtype first."""

    def io(t):
        return t.to(x.dtype).double()

    if convention not in ("single_rounding", "diffusers"):
        raise ValueError(f"unknown convention {convention!r}")
    update = h.double() if gate is None else h.double() * gate.double()
    if convention == "diffusers" and gate is not None:
        update = io(update)
    r = io(x.double() + update)
    normed = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps)
    if convention == "single_rounding":
        normed = normed if weight is None else normed * weight.double()
        return normed * (1 + scale.double()) + shift.double(), r
    normed = io(normed) if weight is None else io(io(normed) * weight.double())
    return io(normed * io(1 + scale.double())) + shift.double(), r


def diffusers_residual_modulation(
    x: torch.Tensor,
    h: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    gate: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
):
    """LTXVideoTransformerBlock: hidden_states + ff_output * gate, then the next norm and modulation."""
    r = x + (h if gate is None else h * gate)
    normed = r * torch.rsqrt(r.to(torch.float32).pow(2).mean(-1, keepdim=True) + eps)
    normed = normed.to(x.dtype) if weight is None else normed.to(weight.dtype) * weight
    return normed * (1 + scale) + shift, r


spec = OpSpec(
    name="residual_adaln_rmsnorm",
    summary="gated residual add, then RMSNorm with (1 + scale) and shift modulation, returning both",
    tensors=[
        Tensor(name="x", dims="*rows hidden", doc="the residual stream [B, S, C]"),
        Tensor(name="h", dims="*rows hidden", doc="the sublayer's output, same shape as x"),
        Tensor(name="scale", dims="*rows hidden", broadcast=True, doc="[B, 1, C] or [B, S, C]"),
        Tensor(name="shift", dims="*rows hidden", broadcast=True, doc="[B, 1, C] or [B, S, C]"),
        Tensor(
            name="gate",
            dims="*rows hidden",
            broadcast=True,
            optional=True,
            absent_value=1.0,
            doc="[B, 1, C] or [B, S, C], or None",
        ),
        Tensor(name="weight", dims="hidden", optional=True, absent_value=1.0, doc="RMSNorm weight, or None"),
        Tensor(name="out", dims="*rows hidden", role="output"),
        Tensor(name="residual_out", dims="*rows hidden", role="output"),
    ],
    params=[Param(name="eps", default=1e-6, positive=True, doc="added to mean(r²)")],
    structure=RowReduce(
        prologue={"residual_out": to_io_dtype(x + h * gate)},
        reductions=[
            Reduction(stat="rstd", summand=residual_out**2, finalize=1 / sp.sqrt(row_sum * inv_hidden + eps))
        ],
        conventions=[
            Convention(
                name="single_rounding",
                outputs={
                    "out": residual_out * rstd * weight * (1 + scale) + shift,
                    "residual_out": residual_out,
                },
                matches="r = x + h·gate rounded once (as stored), the rest in fp32, rounded once",
            ),
            Convention(
                name="diffusers",
                prologue={"residual_out": to_io_dtype(x + to_io_dtype(h * gate))},
                outputs={
                    "out": to_io_dtype(
                        to_io_dtype(to_io_dtype(residual_out * rstd) * weight) * to_io_dtype(1 + scale)
                    )
                    + shift,
                    "residual_out": residual_out,
                },
                matches="diffusers LTX-Video blocks: each step in the dtype",
            ),
        ],
    ),
    reference=residual_adaln_rmsnorm_ref,
    peers={"eager (diffusers residual + RMSNorm + modulation)": diffusers_residual_modulation},
)
