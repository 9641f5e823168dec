"""RMSNorm over the last dim: out = x / sqrt(mean(x²) + eps) · weight.

Order: reference, the implementations it replaces, then the spec.
"""

import sympy as sp
import torch

from kgen.dsl import Convention, Layer, OpSpec, Param, Tensor, inv_hidden, to_io_dtype
from kgen.families.row_reduce import Reduction, RowReduce, row_sum

x, weight, eps, rstd = sp.symbols("x weight eps rstd")


def rmsnorm_ref(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    convention: str = "single_rounding",
) -> torch.Tensor:
    """float64 reference. ``transformers`` reproduces its intermediate rounding to x's dtype
    before the weight multiply; the result is float64 for the caller to compare or round."""
    x64 = x.double()
    normed = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    if convention == "transformers":
        normed = normed.to(x.dtype).double()
    elif convention != "single_rounding":
        raise ValueError(f"unknown convention {convention!r}")
    return normed if weight is None else normed * weight.double()


def llama_rmsnorm_eager(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm.forward as users run it today (eager)."""
    input_dtype = x.dtype
    hidden_states = x.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + eps)
    return hidden_states.to(input_dtype) if weight is None else weight * hidden_states.to(input_dtype)


def torch_rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """PyTorch's fused op."""
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)


def liger_rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """Liger-Kernel's Triton RMSNorm (what LigerRMSNorm runs), in its transformers-matching "llama"
    casting."""
    from liger_kernel.ops import LigerRMSNormFunction  # lazily: liger-kernel is optional

    # offset 0.0; "llama" casting: fp32 rstd, x · rstd rounded to x's dtype, then · weight (this spec's
    # transformers convention). A None weight is elementwise_affine=False. Its in_place flag only lets
    # the backward overwrite dY: the forward writes a new output.
    return LigerRMSNormFunction.apply(x, weight, eps, 0.0, "llama")


spec = OpSpec(
    name="rmsnorm",
    summary="RMSNorm over the last dim, optional weight, fp32 statistics",
    tensors=[
        Tensor(name="x", dims="*rows hidden", doc="input, any number of leading dims"),
        Tensor(
            name="weight",
            dims="hidden",
            optional=True,
            absent_value=1.0,
            doc="per-channel scale; None for diffusers' elementwise_affine=False",
        ),
        Tensor(name="out", dims="*rows hidden", role="output"),
    ],
    params=[Param(name="eps", default=1e-6, positive=True, doc="added to mean(x²)")],
    structure=RowReduce(
        # mean(x²) as sum · (1/hidden): the same fp32 operations as torch's mean reduction.
        reductions=[Reduction(stat="rstd", summand=x**2, finalize=1 / sp.sqrt(row_sum * inv_hidden + eps))],
        conventions=[
            Convention(
                name="single_rounding",
                outputs={"out": x * rstd * weight},
                matches="torch.nn.RMSNorm, torch.nn.functional.rms_norm, diffusers RMSNorm",
            ),
            Convention(
                name="transformers",
                outputs={"out": weight * to_io_dtype(x * rstd)},
                matches="transformers LlamaRMSNorm / Qwen3RMSNorm: round to x's dtype, then weight ·",
            ),
        ],
    ),
    reference=rmsnorm_ref,
    peers={
        "eager (transformers)": llama_rmsnorm_eager,
        "F.rms_norm": torch_rms_norm,
        "Liger (LigerRMSNormFunction)": liger_rms_norm,
    },
    layers=[
        Layer(
            name="RMSNorm",
            replaces=[
                "transformers.models.llama.modeling_llama.LlamaRMSNorm",
                "transformers.models.qwen3.modeling_qwen3.Qwen3RMSNorm",
            ],
            forward_args=["hidden_states"],
            bind={"x": "hidden_states", "weight": "self.weight", "eps": "self.variance_epsilon"},
            convention="transformers",
        ),
    ],
)
