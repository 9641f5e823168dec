"""The residual step of a DiT block fused with the next AdaLN-LayerNorm (DiT / Flux
`AdaLayerNormZero` after a gated residual): r = x + h · gate (gate optional), y = layernorm(r)
· (1 + scale) + shift, LayerNorm without affine; returns (y, r) in one pass.

Order: reference, the implementations it replaces, then the spec.
"""

import sympy as sp
import torch
import torch.nn.functional as F

from kgen.catalog import load_spec
from kgen.dsl import Convention, OpSpec, inv_hidden, to_io_dtype
from kgen.families.row_reduce import Reduction, RowReduce, row_sum

RESIDUAL_RMS = load_spec("residual_adaln_rmsnorm")  # the same tensors and eps, less the weight
x, h, scale, shift, gate, eps, mean, rstd, residual_out = sp.symbols(
    "x h scale shift gate eps mean rstd residual_out"
)


def residual_adaln_layernorm_ref(
    x: torch.Tensor,
    h: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    gate: torch.Tensor | None = None,
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
    normed = F.layer_norm(r, r.shape[-1:], eps=eps)
    if convention == "single_rounding":
        return normed * (1 + scale.double()) + shift.double(), r
    return io(io(normed) * io(1 + scale.double())) + shift.double(), r


def dit_residual_modulation(
    x: torch.Tensor,
    h: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    gate: torch.Tensor | None = None,
    eps: float = 1e-6,
):
    """A DiT block: hidden + gate * sublayer_out, then the next LayerNorm and modulation."""
    r = x + (h if gate is None else h * gate)
    return F.layer_norm(r, r.shape[-1:], eps=eps) * (1 + scale) + shift, r


spec = OpSpec(
    name="residual_adaln_layernorm",
    summary="gated residual add, then LayerNorm (no affine) with (1 + scale) and shift modulation, returning "
    "both",
    tensors=[t for t in RESIDUAL_RMS.tensors if t.name != "weight"],
    params=RESIDUAL_RMS.params,
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
                matches="r = x + h·gate rounded once (as stored), the rest in fp32, rounded once",
            ),
            Convention(
                name="diffusers",
                prologue={"residual_out": to_io_dtype(x + to_io_dtype(h * gate))},
                outputs={
                    "out": to_io_dtype(to_io_dtype((residual_out - mean) * rstd) * to_io_dtype(1 + scale))
                    + shift,
                    "residual_out": residual_out,
                },
                matches="diffusers / Flux blocks: each step in the dtype",
            ),
        ],
    ),
    reference=residual_adaln_layernorm_ref,
    peers={"eager (residual + LayerNorm + modulation)": dit_residual_modulation},
)
