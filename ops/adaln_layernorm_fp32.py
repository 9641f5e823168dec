"""AdaLN over an FP32LayerNorm with float32 modulation (Wan 2.x's norm1 / norm3 / norm_out): y =
layernorm(x) · (1 + scale) + shift computed in fp32 and rounded once to x's dtype, LayerNorm without affine,
scale and shift float32 per batch ([B, 1, C]) or per token ([B, S, C]) as Wan's `scale_shift_table +
temb.float()` chunks are.

Order: reference, the implementations it replaces, then the spec.
"""

import sympy as sp
import torch
import torch.nn.functional as F

from kgen.dsl import Convention, OpSpec, Param, Tensor, inv_hidden
from kgen.families.row_reduce import Reduction, RowReduce, row_sum

x, scale, shift, eps, mean, rstd = sp.symbols("x scale shift eps mean rstd")


def adaln_layernorm_fp32_ref(
    x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, eps: float = 1e-6
) -> torch.Tensor:
    """float64 reference."""
    return F.layer_norm(x.double(), x.shape[-1:], eps=eps) * (1 + scale.double()) + shift.double()


def wan_modulation(
    x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, eps: float = 1e-6
) -> torch.Tensor:
    """Wan's block: FP32LayerNorm (no affine) of x.float(), `* (1 + scale) + shift` in fp32, `.type_as(x)`."""
    return (F.layer_norm(x.float(), x.shape[-1:], eps=eps) * (1 + scale) + shift).type_as(x)


spec = OpSpec(
    name="adaln_layernorm_fp32",
    summary="FP32LayerNorm (no affine) then float32 (1 + scale) and shift modulation, rounded once (Wan)",
    tensors=[
        Tensor(name="x", dims="*rows hidden", doc="[B, S, C]"),
        Tensor(
            name="scale", dims="*rows hidden", dtype="float32", broadcast=True, doc="[B, 1, C] or [B, S, C]"
        ),
        Tensor(
            name="shift", dims="*rows hidden", dtype="float32", broadcast=True, doc="[B, 1, C] or [B, S, C]"
        ),
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
                matches="Wan's FP32LayerNorm and modulation: fp32 math, float32 scale and shift, rounded "
                "once",
            ),
        ],
    ),
    reference=adaln_layernorm_fp32_ref,
    peers={"eager (Wan: FP32LayerNorm + fp32 modulation)": wan_modulation},
)
