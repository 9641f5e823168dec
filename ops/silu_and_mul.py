"""SwiGLU activation of the Llama/Qwen MLP from one packed [..., 2F] input (gate first, then up,
as a fused gate_up projection writes it): out = silu(gate) · up.

Order: reference, the implementations it replaces, then the spec.
"""

import sympy as sp
import torch
import torch.nn.functional as F

from kgen.dsl import Convention, OpSpec, Tensor, to_io_dtype
from kgen.families.elementwise import Elementwise

gate, up = sp.symbols("gate up")
silu = gate / (1 + sp.exp(-gate))


def silu_and_mul_ref(x: torch.Tensor, convention: str = "single_rounding") -> torch.Tensor:
    """float64 reference."""
    g, u = x.double().chunk(2, dim=-1)
    activated = F.silu(g)
    if convention == "transformers":
        activated = activated.to(x.dtype).double()
    elif convention != "single_rounding":
        raise ValueError(f"unknown convention {convention!r}")
    return activated * u


def transformers_mlp_activation(x: torch.Tensor) -> torch.Tensor:
    """LlamaMLP's act_fn(gate_proj(x)) * up_proj(x), on a fused gate_up output."""
    g, u = x.chunk(2, dim=-1)
    return F.silu(g) * u


def liger_fused_gate_up_silu_mul(x: torch.Tensor) -> torch.Tensor:
    """Liger-Kernel's Triton SwiGLU on a fused [gate | up] tensor (gate first, as here)."""
    from liger_kernel.ops import LigerFusedGateUpSiLUMulFunction  # lazily: liger-kernel is optional

    # silu(gate) in fp32 rounded to the dtype, then · up; a new output (in_place only concerns the backward)
    return LigerFusedGateUpSiLUMulFunction.apply(x)


spec = OpSpec(
    name="silu_and_mul",
    summary="SwiGLU: silu(gate) · up from one packed [..., 2F] input",
    tensors=[
        Tensor(
            name="x",
            dims="*rows 2*hidden",
            halves=("gate", "up"),
            doc="[..., 2F]: gate (first half) then up (second half)",
        ),
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
    reference=silu_and_mul_ref,
    peers={
        "eager (transformers MLP activation)": transformers_mlp_activation,
        "Liger (LigerFusedGateUpSiLUMulFunction)": liger_fused_gate_up_silu_mul,
    },
)
