"""Each row of x times its own scale, computed by the row_scale family from outside kgen (tests/families/).

Order: reference, then the spec.
"""

import sympy as sp
import torch
from kgen_families.row_scale import RowScale

from kgen.dsl import Convention, OpSpec, Tensor

x, s = sp.symbols("x s")


def scale_rows_ref(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """float64 reference."""
    return x.double() * s.double().unsqueeze(-1)


spec = OpSpec(
    name="scale_rows",
    summary="each row of x times its own scale",
    tensors=[
        Tensor(name="x", dims="*rows hidden", doc="input, any number of leading dims"),
        Tensor(name="s", dims="*rows", doc="one scale per row: x's leading dims"),
        Tensor(name="out", dims="*rows hidden", role="output"),
    ],
    structure=RowScale(
        conventions=[
            Convention(name="single_rounding", outputs={"out": x * s}, matches="x · s in fp32, rounded once"),
        ]
    ),
    reference=scale_rows_ref,
)
