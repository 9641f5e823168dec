"""AdaLN with LayerNorm without affine (DiT / Flux `AdaLayerNormZero`): y = layernorm(x) ·
(1 + scale) + shift, scale and shift per batch ([B, 1, C]) or per token ([B, S, C]).

Order: reference, the implementations it replaces, then the spec.
"""

import sympy as sp
import torch
import torch.nn.functional as F

from kgen.dsl import Convention, OpSpec, Param, Tensor, inv_hidden, to_io_dtype
from kgen.families.row_reduce import Reduction, RowReduce, row_sum

x, scale, shift, eps, mean, rstd = sp.symbols("x scale shift eps mean rstd")


def adaln_layernorm_ref(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    eps: float = 1e-6,
    convention: str = "single_rounding",
) -> torch.Tensor:
    """float64 reference."""
    normed = F.layer_norm(x.double(), x.shape[-1:], eps=eps)
    if convention == "single_rounding":
        return normed * (1 + scale.double()) + shift.double()
    if convention != "diffusers":
        raise ValueError(f"unknown convention {convention!r}")

    def io(t):
        return t.to(x.dtype).double()

    return io(io(normed) * io(1 + scale.double())) + shift.double()


def diffusers_layernorm_modulation(
    x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, eps: float = 1e-6
) -> torch.Tensor:
    """AdaLayerNormZero: LayerNorm(elementwise_affine=False), then `* (1 + scale) + shift`."""
    return F.layer_norm(x, x.shape[-1:], eps=eps) * (1 + scale) + shift


spec = OpSpec(
    name="adaln_layernorm",
    summary="LayerNorm (no affine) then (1 + scale) and shift modulation, scale/shift per batch or per token",
    tensors=[
        Tensor(name="x", dims="*rows hidden", doc="[B, S, C]"),
        Tensor(name="scale", dims="*rows hidden", broadcast=True, doc="[B, 1, C] or [B, S, C]"),
        Tensor(name="shift", dims="*rows hidden", broadcast=True, doc="[B, 1, C] or [B, S, C]"),
        Tensor(name="out", dims="*rows hidden", role="output"),
    ],
    params=[Param(name="eps", default=1e-6, positive=True, doc="added to the variance")],
    structure=RowReduce(
        reductions=[
            Reduction(stat="mean", summand=x, finalize=row_sum * inv_hidden),
            Reduction(stat="rstd", summand=(x - mean) ** 2, finalize=1 / sp.sqrt(row_sum * inv_hidden + eps)),
        ],
        conventions=[
            Convention(
                name="single_rounding",
                outputs={"out": (x - mean) * rstd * (1 + scale) + shift},
                matches="the math in fp32, rounded once",
            ),
            Convention(
                name="diffusers",
                outputs={"out": to_io_dtype(to_io_dtype((x - mean) * rstd) * to_io_dtype(1 + scale)) + shift},
                matches="F.layer_norm then `* (1 + scale) + shift` in the dtype (AdaLayerNormZero)",
            ),
        ],
    ),
    reference=adaln_layernorm_ref,
    peers={"eager (LayerNorm + modulation)": diffusers_layernorm_modulation},
)
