"""A test op (on $KGEN_OPS_PATH in tests/test_toolchain.py): two outputs from two inputs, a product and a
weighted sum, for the autograd of an op with several outputs."""

import sympy as sp
import torch

from kgen.dsl import Convention, OpSpec, Tensor
from kgen.families.elementwise import Elementwise

x, y = sp.symbols("x y")


def pair_ops_ref(x: torch.Tensor, y: torch.Tensor):
    return x.double() * y.double(), x.double() + 2 * y.double()


spec = OpSpec(
    name="pair_ops",
    summary="a product and a weighted sum",
    tensors=[
        Tensor(name="x", dims="*rows hidden"),
        Tensor(name="y", dims="*rows hidden"),
        Tensor(name="prod", dims="*rows hidden", role="output"),
        Tensor(name="total", dims="*rows hidden", role="output"),
    ],
    structure=Elementwise(
        conventions=[Convention(name="plain", matches="-", outputs={"prod": x * y, "total": x + 2 * y})]
    ),
    reference=pair_ops_ref,
)
