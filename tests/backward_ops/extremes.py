"""A test op (on $KGEN_OPS_PATH in tests/test_extremes.py): the larger and the smaller of two tensors, as
torch.maximum and torch.minimum (NaN where either is NaN; a tie's gradient split in halves)."""

import sympy as sp
import torch

from kgen.dsl import Convention, OpSpec, Tensor
from kgen.families.elementwise import Elementwise

x, y = sp.symbols("x y")


def extremes_ref(x: torch.Tensor, y: torch.Tensor):
    return torch.maximum(x.double(), y.double()), torch.minimum(x.double(), y.double())


spec = OpSpec(
    name="extremes",
    summary="the larger and the smaller of two tensors",
    tensors=[
        Tensor(name="x", dims="*rows hidden"),
        Tensor(name="y", dims="*rows hidden"),
        Tensor(name="hi", dims="*rows hidden", role="output"),
        Tensor(name="lo", dims="*rows hidden", role="output"),
    ],
    structure=Elementwise(
        conventions=[
            Convention(
                name="single_rounding",
                matches="torch.maximum, torch.minimum",
                outputs={"hi": sp.Max(x, y), "lo": sp.Min(x, y)},
            )
        ]
    ),
    reference=extremes_ref,
)
