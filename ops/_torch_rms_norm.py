"""torch.nn.RMSNorm as the norm before a rotation (Flux.1's, Wan's and LTX-Video's norm_q / norm_k): mean(x²)
as the fp32 sum · (1/count), then rstd · weight · x rounded once to the I/O dtype, over each head or over a
token's heads together; and the eps param the fused ops take after the rotation's."""

import sympy as sp

from kgen.dsl import Param, to_io_dtype
from kgen.families.rotary import RotaryNorm, inv_count, row_sum, rstd, weight

x, eps = sp.symbols("x eps")
EPS = Param(name="eps", default=1e-6, positive=True, doc="the norms' eps")


def torch_rms_norm(over: str) -> RotaryNorm:
    """q's and k's norm (weights x_weight, k_weight) over each head or each token's heads."""
    return RotaryNorm(
        over=over,
        weights=["x_weight", "k_weight"],
        summand=x**2,
        finalize=1 / sp.sqrt(row_sum * inv_count + eps),
        normed=to_io_dtype(x * rstd * weight),
    )
