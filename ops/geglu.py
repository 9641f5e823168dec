"""GEGLU (diffusers `GEGLU`): the input's last dim holds two halves, hidden then gate;
out = hidden · gelu(gate). Exact erf GELU by default, the tanh approximation as a convention,
and diffusers' rounding (gelu(gate) stored in the I/O dtype before the product) for both.

Order: reference, the implementations it replaces, then the spec.
"""

import math

import sympy as sp
import torch
import torch.nn.functional as F

from kgen.dsl import Convention, OpSpec, Tensor, to_io_dtype
from kgen.families.elementwise import Elementwise

h, gate = sp.symbols("h gate")
SQRT_HALF = sp.Float(math.sqrt(0.5))
SQRT_2_OVER_PI = sp.Float(math.sqrt(2 / math.pi))
gelu_erf = gate * (1 + sp.erf(gate * SQRT_HALF)) / 2
# √(2/π)·(g + 0.044715·g³) kept as that product, as F.gelu rounds it (sympy would distribute it)
gelu_tanh = (
    gate * (1 + sp.tanh(sp.Mul(SQRT_2_OVER_PI, gate + sp.Float(0.044715) * gate**3, evaluate=False))) / 2
)


def geglu_ref(x: torch.Tensor, convention: str = "erf") -> torch.Tensor:
    """float64 reference."""
    approximate, _, library = convention.partition("_")
    if approximate not in ("erf", "tanh") or library not in ("", "diffusers"):
        raise ValueError(f"unknown convention {convention!r}")
    hidden, g = x.double().chunk(2, dim=-1)
    activated = F.gelu(g, approximate="none" if approximate == "erf" else "tanh")
    if library:
        activated = activated.to(x.dtype).double()
    return hidden * activated


def diffusers_geglu(x: torch.Tensor) -> torch.Tensor:
    """diffusers GEGLU after its projection: chunk, then hidden * F.gelu(gate)."""
    hidden, g = x.chunk(2, dim=-1)
    return hidden * F.gelu(g)


def diffusers_geglu_tanh(x: torch.Tensor) -> torch.Tensor:
    hidden, g = x.chunk(2, dim=-1)
    return hidden * F.gelu(g, approximate="tanh")


spec = OpSpec(
    name="geglu",
    summary="GEGLU: hidden · gelu(gate) from one packed [..., 2F] input",
    tensors=[
        Tensor(
            name="x",
            dims="*rows 2*hidden",
            halves=("h", "gate"),
            doc="[..., 2F]: hidden (first half) then gate (second half)",
        ),
        Tensor(name="out", dims="*rows hidden", role="output"),
    ],
    structure=Elementwise(
        conventions=[
            Convention(
                name="erf",
                outputs={"out": h * gelu_erf},
                matches="exact (erf) GELU, computed in fp32 and rounded once",
            ),
            Convention(
                name="tanh",
                outputs={"out": h * gelu_tanh},
                matches="tanh-approximated GELU, computed in fp32 and rounded once",
            ),
            Convention(
                name="erf_diffusers",
                outputs={"out": h * to_io_dtype(gelu_erf)},
                matches="diffusers GEGLU(approximate='none'): gelu(gate) rounded to the dtype, then the "
                "product",
            ),
            Convention(
                name="tanh_diffusers",
                outputs={"out": h * to_io_dtype(gelu_tanh)},
                matches="diffusers GEGLU(approximate='tanh'): gelu(gate) rounded to the dtype, then the "
                "product",
            ),
        ]
    ),
    reference=geglu_ref,
    peers={"eager (diffusers GEGLU)": diffusers_geglu},
)
