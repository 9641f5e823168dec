"""GELU with the tanh approximation, as in LTX-Video's FeedForward (diffusers `GELU(approximate="tanh")`):
0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), computed in fp32 and rounded once, as F.gelu does.

Order: reference, the implementations it replaces, then the spec.
"""

import math

import sympy as sp
import torch
import torch.nn.functional as F

from kgen.dsl import Convention, OpSpec, Tensor
from kgen.families.elementwise import Elementwise

x = sp.Symbol("x")
SQRT_2_OVER_PI = sp.Float(math.sqrt(2 / math.pi))


def gelu_tanh_ref(x: torch.Tensor) -> torch.Tensor:
    """float64 reference."""
    return F.gelu(x.double(), approximate="tanh")


def diffusers_gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def written_out_gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """The formula as model code often spells it (GPT-2 style NewGELU)."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


spec = OpSpec(
    name="gelu_tanh",
    summary="GELU with the tanh approximation",
    tensors=[
        Tensor(name="x", dims="*rows hidden"),
        Tensor(name="out", dims="*rows hidden", role="output"),
    ],
    structure=Elementwise(
        conventions=[
            Convention(
                name="single_rounding",
                # √(2/π)·(x + 0.044715·x³) kept as that product: sympy would distribute it into two
                # terms, each rounded differently from F.gelu's kBeta · (x + kKappa · x³)
                outputs={
                    "out": x
                    * (1 + sp.tanh(sp.Mul(SQRT_2_OVER_PI, x + sp.Float(0.044715) * x**3, evaluate=False)))
                    / 2
                },
                matches="F.gelu(x, approximate='tanh') and diffusers GELU(approximate='tanh')",
            ),
        ]
    ),
    reference=gelu_tanh_ref,
    peers={
        "eager (written-out formula)": written_out_gelu_tanh,
        "F.gelu(approximate='tanh')": diffusers_gelu_tanh,
    },
)
