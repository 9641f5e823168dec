"""SwiGLU activation of the Llama/Qwen MLP from two tensors: out = silu(x) · up, where x is
gate_proj's output and up is up_proj's.

Order: reference, the implementations it replaces, then the spec.
"""

import sympy as sp
import torch
import torch.nn.functional as F

from kgen.dsl import Convention, Layer, OpSpec, Tensor, to_io_dtype
from kgen.families.elementwise import Elementwise

x, up = sp.symbols("x up")
silu = x / (1 + sp.exp(-x))


def silu_mul_ref(x: torch.Tensor, up: torch.Tensor, convention: str = "single_rounding") -> torch.Tensor:
    """float64 reference."""
    activated = F.silu(x.double())
    if convention == "transformers":
        activated = activated.to(x.dtype).double()
    elif convention != "single_rounding":
        raise ValueError(f"unknown convention {convention!r}")
    return activated * up.double()


def transformers_mlp_activation(x: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """LlamaMLP: act_fn(gate_proj(x)) * up_proj(x)."""
    return F.silu(x) * up


def silu_activation(mlp: torch.nn.Module) -> bool:
    """The MLP's act_fn is SiLU (config.hidden_act "silu"): the only MLPs the layer's forward computes."""
    return type(getattr(mlp, "act_fn", None)).__name__ in ("SiLU", "SiLUActivation")


def liger_silu_mul(x: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Liger-Kernel's Triton SwiGLU (what LigerSwiGLUMLP runs): silu(gate) in fp32, rounded, then · up."""
    from liger_kernel.ops import LigerSiLUMulFunction  # lazily: liger-kernel is optional

    return LigerSiLUMulFunction.apply(x, up)


spec = OpSpec(
    name="silu_mul",
    summary="SwiGLU: silu(gate) · up from two tensors",
    tensors=[
        Tensor(name="x", dims="*rows hidden", doc="the gate projection's output"),
        Tensor(name="up", dims="*rows hidden", doc="the up projection's output, same shape and dtype"),
        Tensor(name="out", dims="*rows hidden", role="output"),
    ],
    structure=Elementwise(
        conventions=[
            Convention(
                name="single_rounding",
                outputs={"out": silu * up},
                matches="silu(gate) · up in fp32, rounded once",
            ),
            Convention(
                name="transformers",
                outputs={"out": to_io_dtype(silu) * up},
                matches="transformers LlamaMLP / Qwen3MLP: silu(gate) rounded to the dtype, then the product",
            ),
        ]
    ),
    reference=silu_mul_ref,
    peers={
        "eager (transformers MLP activation)": transformers_mlp_activation,
        "Liger (LigerSiLUMulFunction)": liger_silu_mul,
    },
    layers=[
        Layer(
            name="GatedMLP",
            replaces=[
                "transformers.models.llama.modeling_llama.LlamaMLP",
                "transformers.models.qwen3.modeling_qwen3.Qwen3MLP",
            ],
            forward_args=["x"],
            bind={"x": "self.gate_proj(x)", "up": "self.up_proj(x)"},
            returns="self.down_proj",
            condition=silu_activation,
            convention="transformers",
        ),
    ],
)
