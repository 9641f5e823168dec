"""LayerNorm over the last dim: out = (x - mean) / sqrt(var + eps) · weight + bias, with fp32
statistics (mean, then the biased variance around it: two passes over the row on chip).

Order: reference, the implementations it replaces, then the spec.
"""

import sympy as sp
import torch

from kgen.dsl import Convention, Layer, OpSpec, Param, Tensor, inv_hidden
from kgen.families.row_reduce import Reduction, RowReduce, row_sum

x, weight, bias, eps, mean, rstd = sp.symbols("x weight bias eps mean rstd")


def layernorm_ref(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    convention: str = "single_rounding",
) -> torch.Tensor:
    """float64 reference; the result is float64 for the caller to compare or round."""
    if convention != "single_rounding":
        raise ValueError(f"unknown convention {convention!r}")
    x64 = x.double()
    mean_ = x64.mean(-1, keepdim=True)
    out = (x64 - mean_) * torch.rsqrt((x64 - mean_).pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        out = out * weight.double()
    return out if bias is None else out + bias.double()


def torch_layer_norm(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
) -> torch.Tensor:
    """torch.nn.LayerNorm's forward (PyTorch's fused op), as users run it today."""
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def liger_layer_norm(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
) -> torch.Tensor:
    """Liger-Kernel's Triton LayerNorm (what LigerLayerNorm runs): fp32 math, rounded once."""
    from liger_kernel.ops import LigerLayerNormFunction  # lazily: liger-kernel is optional

    # Liger needs both weight and bias (its module always has them; the bench passes both).
    return LigerLayerNormFunction.apply(x, weight, bias, eps)


spec = OpSpec(
    name="layernorm",
    summary="LayerNorm over the last dim, optional weight and bias, fp32 statistics",
    tensors=[
        Tensor(name="x", dims="*rows hidden", doc="input, any number of leading dims"),
        Tensor(
            name="weight", dims="hidden", optional=True, absent_value=1.0, doc="per-channel scale, or None"
        ),
        Tensor(name="bias", dims="hidden", optional=True, absent_value=0.0, doc="per-channel shift, or None"),
        Tensor(name="out", dims="*rows hidden", role="output"),
    ],
    params=[Param(name="eps", default=1e-5, positive=True, doc="added to the variance")],
    structure=RowReduce(
        reductions=[
            Reduction(stat="mean", summand=x, finalize=row_sum * inv_hidden),
            # the biased variance around the mean already on chip: no cancellation of E[x²] - E[x]²
            Reduction(stat="rstd", summand=(x - mean) ** 2, finalize=1 / sp.sqrt(row_sum * inv_hidden + eps)),
        ],
        conventions=[
            Convention(
                name="single_rounding",
                outputs={"out": (x - mean) * rstd * weight + bias},
                matches="torch.nn.LayerNorm, torch.nn.functional.layer_norm (fp32 math, one rounding)",
            ),
        ],
    ),
    reference=layernorm_ref,
    peers={"F.layer_norm": torch_layer_norm, "Liger (LigerLayerNormFunction)": liger_layer_norm},
    layers=[
        Layer(
            name="LayerNorm",
            replaces=["torch.nn.LayerNorm"],
            forward_args=["input"],
            bind={"x": "input", "weight": "self.weight", "bias": "self.bias", "eps": "self.eps"},
            convention="single_rounding",
        ),
    ],
)
