"""AdaLN with RMSNorm (LTX-Video's norm1/norm2 and their modulation): y = rmsnorm(x) · (1 + scale)
+ shift, with scale and shift per batch ([B, 1, C], text-to-video) or per token ([B, S, C],
image-to-video), read in place from strided views such as diffusers' `ada_values.unbind(dim=2)`.

Order: reference, the implementations it replaces, then the spec.
"""

import sympy as sp
import torch

from kgen.dsl import Convention, OpSpec, Param, Tensor, inv_hidden, to_io_dtype
from kgen.families.row_reduce import Reduction, RowReduce, row_sum

x, scale, shift, weight, eps, rstd = sp.symbols("x scale shift weight eps rstd")


def adaln_rmsnorm_ref(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    convention: str = "single_rounding",
) -> torch.Tensor:
    """float64 reference."""
    x64 = x.double()
    normed = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    if convention == "single_rounding":
        normed = normed if weight is None else normed * weight.double()
        return normed * (1 + scale.double()) + shift.double()
    if convention != "diffusers":
        raise ValueError(f"unknown convention {convention!r}")

    def io(t):
        return t.to(x.dtype).double()

    normed = io(normed) if weight is None else io(io(normed) * weight.double())
    return io(normed * io(1 + scale.double())) + shift.double()


def diffusers_rmsnorm_modulation(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """LTXVideoTransformerBlock: norm1 (diffusers RMSNorm), then `* (1 + scale) + shift`."""
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    normed = x * torch.rsqrt(variance + eps)
    normed = normed.to(x.dtype) if weight is None else normed.to(weight.dtype) * weight
    return normed * (1 + scale) + shift


spec = OpSpec(
    name="adaln_rmsnorm",
    summary="RMSNorm then (1 + scale) and shift modulation, scale/shift per batch or per token",
    tensors=[
        Tensor(name="x", dims="*rows hidden", doc="[B, S, C]"),
        Tensor(name="scale", dims="*rows hidden", broadcast=True, doc="[B, 1, C] or [B, S, C]"),
        Tensor(name="shift", dims="*rows hidden", broadcast=True, doc="[B, 1, C] or [B, S, C]"),
        Tensor(name="weight", dims="hidden", optional=True, absent_value=1.0, doc="RMSNorm weight, or None"),
        Tensor(name="out", dims="*rows hidden", role="output"),
    ],
    params=[Param(name="eps", default=1e-6, positive=True, doc="added to mean(x²)")],
    structure=RowReduce(
        reductions=[Reduction(stat="rstd", summand=x**2, finalize=1 / sp.sqrt(row_sum * inv_hidden + eps))],
        conventions=[
            Convention(
                name="single_rounding",
                outputs={"out": x * rstd * weight * (1 + scale) + shift},
                matches="the math in fp32, rounded once",
            ),
            Convention(
                name="diffusers",
                outputs={
                    "out": to_io_dtype(to_io_dtype(to_io_dtype(x * rstd) * weight) * to_io_dtype(1 + scale))
                    + shift
                },
                matches="diffusers RMSNorm then `* (1 + scale) + shift` in the dtype (LTX-Video blocks)",
            ),
        ],
    ),
    reference=adaln_rmsnorm_ref,
    peers={"eager (diffusers RMSNorm + modulation)": diffusers_rmsnorm_modulation},
)
