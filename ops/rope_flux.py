"""Flux.1's rotary embedding of q and k in one launch (diffusers `FluxPosEmbed` + `apply_rotary_emb`) with
the angles computed in the kernel from the token positions instead of read from two fp32 [S, D] tables.
q and k are [B, H, S, D] (any strides with a unit last dim: the heads as diffusers splits them, transposed),
positions [B, 3, S] float32: Flux's ids ([S, 3], text tokens first) transposed, a batch stride of 0
sharing them. Axis a holds dim_a consecutive channels of a head (Flux.1: axes_dims_rope 16, 56, 56) in
interleaved pairs; pair k of an axis turns at 1 / theta^(2k / dim_a). diffusers builds the tables in
float64 on the ids' device, where a division by a Python number is a multiplication by its reciprocal
(torch's CUDA true division by a CPU scalar), then rounds cos and sin to fp32; the kernel does the same
steps in fp64, then the rotation in fp32 with one rounding.

Order: reference, the implementations it replaces, then the spec.
"""

import sympy as sp
import torch

from kgen.catalog import load_spec
from kgen.dsl import Convention, OpSpec, Param, Tensor
from kgen.families.rotary import GridAngles, Rotary, coord, cos, freq, k, n_freq, sign, sin

rope_apply_ref = load_spec("rope_apply").reference  # x rotated in float64 by [B or 1, S, D] tables
x, x_pair, key, key_pair, t, h, w, theta = sp.symbols("x x_pair k k_pair t h w theta")

PARAMS = [
    Param(name="theta", default=10000.0, positive=True, doc="FluxPosEmbed theta"),
    Param(name="dim_0", default=16, integer=True, doc="axes_dims_rope[0]: channels of axis 0 (ids[:, 0])"),
    Param(name="dim_1", default=56, integer=True, doc="axes_dims_rope[1]: channels of axis 1 (ids[:, 1])"),
    Param(name="dim_2", default=56, integer=True, doc="axes_dims_rope[2]: channels of axis 2 (ids[:, 2])"),
]


def flux_tables(positions: torch.Tensor, theta: float, dims: tuple[int, ...]) -> tuple:
    """FluxPosEmbed's (cos, sin) [S, D] float32 from positions [3, S]: its steps, in float64 on their
    device."""
    cos, sin = [], []
    for axis, dim in enumerate(dims):
        exponent = torch.arange(0, dim, 2, dtype=torch.float64, device=positions.device) / dim
        angles = torch.outer(positions[axis].float(), 1.0 / (theta**exponent))
        cos.append(angles.cos().repeat_interleave(2, dim=1).float())
        sin.append(angles.sin().repeat_interleave(2, dim=1).float())
    return torch.cat(cos, dim=-1), torch.cat(sin, dim=-1)


def rope_flux_ref(
    x: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    theta: float = 10000.0,
    dim_0: int = 16,
    dim_1: int = 56,
    dim_2: int = 56,
    tables: bool = False,
):
    """The tables as diffusers builds them (one set per batch), applied to q and k in float64; with
    ``tables``, the (cos, sin) tables [B, S, D] themselves."""
    per_batch = [flux_tables(p, theta, (dim_0, dim_1, dim_2)) for p in positions]
    cos, sin = torch.stack([c for c, _ in per_batch]), torch.stack([s for _, s in per_batch])
    if tables:
        return cos, sin
    return rope_apply_ref(x, cos, sin), rope_apply_ref(k, cos, sin)


def diffusers_apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """diffusers' apply_rotary_emb (use_real, unbind dim -1) of x [B, H, S, D] with tables [B, 1, S, D]."""
    real, imag = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
    rotated = torch.stack([-imag, real], dim=-1).flatten(3)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


_TABLES: dict = {}


def diffusers_flux_rope(x: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, *params):
    """What Flux runs per attention call: apply_rotary_emb on q and on k with the fp32 tables FluxPosEmbed
    builds once per forward (built once here, not timed)."""
    key_ = (tuple(x.shape), positions.data_ptr(), params)
    if key_ not in _TABLES:
        _TABLES.clear()
        _TABLES[key_] = tuple(t.unsqueeze(1) for t in rope_flux_ref(x, k, positions, *params, tables=True))
    return diffusers_apply(x, *_TABLES[key_]), diffusers_apply(k, *_TABLES[key_])


spec = OpSpec(
    name="rope_flux",
    summary="Flux.1 rotary embedding of q and k in one launch, angles computed in the kernel from the ids",
    tensors=[
        Tensor(name="x", dims="*rows hidden", doc="q: [B, H, S, D]"),
        Tensor(name="k", dims="*rows hidden", doc="k: [B, H, S, D]"),
        Tensor(
            name="positions",
            dims="batch axes tokens",
            dtype="float32",
            doc="[B, 3, S] float32: the ids [S, 3] transposed (a batch stride of 0 shares them)",
        ),
        Tensor(name="out", dims="*rows hidden", role="output"),
        Tensor(name="k_out", dims="*rows hidden", role="output"),
    ],
    params=PARAMS,
    structure=Rotary(
        pairing="interleaved",
        rotates=["x", "k"],
        grid=GridAngles(
            axes=["t", "h", "w"],
            coordinates_input="positions",
            coordinates=[t, h, w],
            layout="blocks",
            axis_dims=["dim_0", "dim_1", "dim_2"],
            # 1.0 / theta ** (arange(0, dim, 2) / dim) with / dim as · (1 / dim), dim = 2·n_freq
            frequency=1
            / sp.UnevaluatedExpr(theta ** sp.UnevaluatedExpr(2 * k * sp.UnevaluatedExpr(1 / (2 * n_freq)))),
            angle=coord * freq,
            precision="float64",
        ),
        conventions=[
            Convention(
                name="single_rounding",
                outputs={"out": x * cos + sign * x_pair * sin, "k_out": key * cos + sign * key_pair * sin},
                matches="diffusers FluxPosEmbed + apply_rotary_emb on q and k: float64 angles, fp32 tables, "
                "fp32 math, one rounding",
            ),
        ],
    ),
    reference=rope_flux_ref,
    peers={"eager (diffusers apply_rotary_emb on q and k, fp32 tables)": diffusers_flux_rope},
)
