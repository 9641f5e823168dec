"""Residual add fused with RMSNorm: residual_out = x + residual (rounded to the I/O dtype, as the
unfused code stores it), out = rmsnorm(residual_out, weight). One read of each input, one write of
each output.

Order: reference, the implementations it replaces, then the spec.
"""

import sympy as sp
import torch

from kgen.dsl import Convention, OpSpec, Param, Tensor, inv_hidden, to_io_dtype
from kgen.families.row_reduce import Reduction, RowReduce, row_sum

x, residual, weight, eps, rstd, residual_out = sp.symbols("x residual weight eps rstd residual_out")


def fused_add_rmsnorm_ref(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    convention: str = "single_rounding",
):
    """float64 reference: (out, residual_out), residual_out rounded to x's dtype first."""
    summed = (x.double() + residual.double()).to(x.dtype).double()
    normed = summed * torch.rsqrt(summed.pow(2).mean(-1, keepdim=True) + eps)
    if convention == "transformers":
        normed = normed.to(x.dtype).double()
    elif convention != "single_rounding":
        raise ValueError(f"unknown convention {convention!r}")
    return (normed if weight is None else normed * weight.double()), summed


def add_then_llama_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, eps: float):
    """The unfused decoder-layer code: hidden = residual + x, then LlamaRMSNorm."""
    hidden = residual + x
    h32 = hidden.to(torch.float32)
    normed = (h32 * torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return (normed if weight is None else weight * normed), hidden


def liger_fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, eps: float
):
    """Liger-Kernel's Triton fused add + RMSNorm (what LigerFusedAddRMSNorm runs), "llama" casting."""
    from liger_kernel.ops import LigerFusedAddRMSNormFunction  # lazily: liger-kernel is optional

    # Returns (out, residual_out) like this spec: residual_out = x + residual in x's dtype, out its
    # "llama"-cast RMSNorm (this spec's transformers convention). Both are new tensors: its in_place
    # flag (off, the module's default) only concerns the backward. It needs a weight (its module
    # always has one; the bench passes one).
    return LigerFusedAddRMSNormFunction.apply(x, residual, weight, eps, 0.0, "llama", False)


spec = OpSpec(
    name="fused_add_rmsnorm",
    summary="residual add then RMSNorm in one pass, returning both",
    tensors=[
        Tensor(name="x", dims="*rows hidden", doc="the block's output"),
        Tensor(name="residual", dims="*rows hidden", doc="the residual stream, same shape and dtype as x"),
        Tensor(
            name="weight", dims="hidden", optional=True, absent_value=1.0, doc="per-channel scale, or None"
        ),
        Tensor(name="out", dims="*rows hidden", role="output"),
        Tensor(name="residual_out", dims="*rows hidden", role="output"),
    ],
    params=[Param(name="eps", default=1e-6, positive=True, doc="added to mean(r²)")],
    structure=RowReduce(
        prologue={"residual_out": to_io_dtype(x + residual)},
        reductions=[
            Reduction(stat="rstd", summand=residual_out**2, finalize=1 / sp.sqrt(row_sum * inv_hidden + eps))
        ],
        conventions=[
            Convention(
                name="single_rounding",
                outputs={"out": residual_out * rstd * weight, "residual_out": residual_out},
                matches="x + residual, then torch.nn.RMSNorm / F.rms_norm",
            ),
            Convention(
                name="transformers",
                outputs={"out": weight * to_io_dtype(residual_out * rstd), "residual_out": residual_out},
                matches="a transformers decoder layer: residual + x, then LlamaRMSNorm / Qwen3RMSNorm",
            ),
        ],
    ),
    reference=fused_add_rmsnorm_ref,
    peers={
        "eager (add + transformers RMSNorm)": add_then_llama_rmsnorm,
        "Liger (LigerFusedAddRMSNormFunction)": liger_fused_add_rms_norm,
    },
    inplace={"residual_out": "residual"},
)
