"""Wan 2.x's 3D rotary embedding of q and k in one launch (diffusers `WanRotaryPosEmbed` + the attention
processor's `apply_rotary_emb`) with the angles computed in the kernel from the latent grid instead of
read from two fp32 [1, S, 1, D] tables. q and k are [B, H, S, D] (any strides with a unit last dim: the
heads as diffusers splits them, transposed), S = frames·height·width tokens (after patching) in row-major
order. A head's channels are split among the axes: frames dim_t = D - 2·dim_h, height and width dim_h =
dim_w = 2·(D // 6) (Wan's t_dim, h_dim, w_dim), each in interleaved pairs turning at 1 / theta^(2k / dim).
diffusers builds the tables once, on the CPU, in float64 (a true division there), and rounds cos and sin to
fp32; the kernel does the same steps in fp64. The rotation: x1·cos - x2·sin and x1·sin + x2·cos in fp32,
rounded once, which is `x·cos + sign·x_pair·sin` bit for bit.

Order: reference, the implementations it replaces, then the spec.
"""

import sympy as sp
import torch

from kgen.catalog import load_spec
from kgen.dsl import Convention, OpSpec, Param, Tensor
from kgen.families.rotary import GridAngles, Rotary, coord, cos, freq, k, n_freq, sign, sin

rope_apply_ref = load_spec("rope_apply").reference  # x rotated in float64 by [B or 1, S, D] tables
x, x_pair, key, key_pair, f, h, w, theta = sp.symbols("x x_pair k k_pair f h w theta")

PARAMS = [
    Param(name="frames", default=1, integer=True, positive=True, doc="latent frames after patching"),
    Param(name="height", default=1, integer=True, positive=True, doc="latent height after patching"),
    Param(name="width", default=1, integer=True, positive=True, doc="latent width after patching"),
    Param(name="theta", default=10000.0, positive=True, doc="WanRotaryPosEmbed theta"),
    Param(name="dim_t", default=44, integer=True, doc="t_dim: channels of the frame axis (D - 4·(D // 6))"),
    Param(name="dim_h", default=42, integer=True, doc="h_dim: channels of the height axis (2·(D // 6))"),
    Param(name="dim_w", default=42, integer=True, doc="w_dim: channels of the width axis (2·(D // 6))"),
]


def wan_tables(sizes: tuple[int, int, int], theta: float, dims: tuple[int, int, int], device) -> tuple:
    """WanRotaryPosEmbed's (cos, sin) [S, D] float32 for a frames × height × width grid: per axis the
    float64 table of positions 0 to rope_max_seq_len - 1 (1024) built on the CPU (the same shapes, so the
    same vectorized and scalar cos), rounded to fp32, its first rows spread over the grid."""
    cos, sin = [], []
    for axis, (size, dim) in enumerate(zip(sizes, dims)):
        freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        angles = torch.outer(torch.arange(max(size, 1024)), freqs)[:size]
        shape = [1, 1, 1, dim]
        shape[axis] = size
        for out, table in ((cos, angles.cos()), (sin, angles.sin())):
            table = table.repeat_interleave(2, dim=1).float().view(shape).expand(*sizes, dim)
            out.append(table)
    return tuple(torch.cat(t, dim=-1).reshape(-1, sum(dims)).to(device) for t in (cos, sin))


def rope_wan_ref(
    x: torch.Tensor,
    k: torch.Tensor,
    frames: int = 1,
    height: int = 1,
    width: int = 1,
    theta: float = 10000.0,
    dim_t: int = 44,
    dim_h: int = 42,
    dim_w: int = 42,
    tables: bool = False,
):
    """The tables as diffusers builds them, applied to q and k in float64; with ``tables``, the (cos, sin)
    tables [1, S, D] themselves."""
    cos_, sin_ = (
        t.unsqueeze(0) for t in wan_tables((frames, height, width), theta, (dim_t, dim_h, dim_w), x.device)
    )
    if tables:
        return cos_, sin_
    return rope_apply_ref(x, cos_, sin_), rope_apply_ref(k, cos_, sin_)


def diffusers_apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Wan's attention processor's apply_rotary_emb of x [B, H, S, D] with tables [1, 1, S, D]."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = cos[..., 0::2], sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(x)


_TABLES: dict = {}


def diffusers_wan_rope(x: torch.Tensor, k: torch.Tensor, *params):
    """What Wan runs per self-attention call: apply_rotary_emb on q and on k with the fp32 tables (built
    once here, not timed)."""
    key_ = (tuple(x.shape), x.device, params)
    if key_ not in _TABLES:
        _TABLES.clear()
        _TABLES[key_] = tuple(t.unsqueeze(1) for t in rope_wan_ref(x, k, *params, tables=True))
    return diffusers_apply(x, *_TABLES[key_]), diffusers_apply(k, *_TABLES[key_])


spec = OpSpec(
    name="rope_wan",
    summary="Wan 2.x 3D rotary embedding of q and k in one launch, angles computed in the kernel",
    tensors=[
        Tensor(name="x", dims="*rows hidden", doc="q: [B, H, S, D], S = frames·height·width"),
        Tensor(name="k", dims="*rows hidden", doc="k: [B, H, S, D]"),
        Tensor(name="out", dims="*rows hidden", role="output"),
        Tensor(name="k_out", dims="*rows hidden", role="output"),
    ],
    params=PARAMS,
    structure=Rotary(
        pairing="interleaved",
        rotates=["x", "k"],
        grid=GridAngles(
            axes=["f", "h", "w"],
            sizes=["frames", "height", "width"],
            coordinates=[f, h, w],
            layout="blocks",
            axis_dims=["dim_t", "dim_h", "dim_w"],
            frequency=1 / sp.UnevaluatedExpr(theta ** (k / n_freq)),  # 2k / dim, a true division
            angle=coord * freq,
            precision="float64",
        ),
        conventions=[
            Convention(
                name="single_rounding",
                outputs={"out": x * cos + sign * x_pair * sin, "k_out": key * cos + sign * key_pair * sin},
                matches="diffusers WanRotaryPosEmbed + WanAttnProcessor's apply_rotary_emb on q and k: "
                "float64 angles, fp32 tables, fp32 math, one rounding",
            ),
        ],
    ),
    reference=rope_wan_ref,
    peers={"eager (diffusers Wan apply_rotary_emb on q and k, fp32 tables)": diffusers_wan_rope},
)
