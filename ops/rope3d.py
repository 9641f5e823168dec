"""LTX-Video's 3D rotary embedding (diffusers `LTXVideoRotaryPosEmbed` + `apply_rotary_emb`) with the
angles computed in the kernel from the latent grid instead of read from two fp32 [B, S, C] tables.
x is [B, S, C] with S = frames·height·width tokens in (f, h, w) row-major order. The coordinate,
frequency and angle math follows diffusers' fp32 steps (torch.linspace's two-sided formula, a
division by a scalar as a multiplication by its fp32 reciprocal), so the angles are diffusers'.

Order: reference, the implementations it replaces, then the spec.
"""

import math

import sympy as sp
import torch

from kgen.catalog import load_spec
from kgen.dsl import Convention, OpSpec, Param, Tensor
from kgen.families.rotary import GridAngles, Rotary, coord, cos, freq, k, n_freq, sign, sin

x, x_pair = sp.symbols("x x_pair")
f, h, w = sp.symbols("f h w")
theta, base_frames, base_height, base_width, scale_t, scale_h, scale_w, patch_t, patch = sp.symbols(
    "theta base_frames base_height base_width scale_t scale_h scale_w patch_t patch"
)
step = 1 / (
    n_freq - 1
)  # torch.linspace(0, 1, n_freq) in fp32: start + step·k up to the middle, then end - step·(n - 1 - k)
linspace = sp.Piecewise(
    (0, sp.Eq(n_freq, 1)), (k * step, k < sp.floor(n_freq / 2)), (1 - step * (n_freq - 1 - k), True)
)

PARAMS = [
    Param(name="frames", default=1, integer=True, positive=True, doc="latent frames F"),
    Param(name="height", default=1, integer=True, positive=True, doc="latent height H"),
    Param(name="width", default=1, integer=True, positive=True, doc="latent width W"),
    Param(name="theta", default=10000.0, positive=True, doc="RoPE base"),
    Param(name="base_frames", default=20.0, positive=True, doc="base_num_frames"),
    Param(name="base_height", default=2048.0, positive=True, doc="base_height"),
    Param(name="base_width", default=2048.0, positive=True, doc="base_width"),
    Param(name="scale_t", default=8 / 25, positive=True, doc="rope_interpolation_scale[0] (8 / frame_rate)"),
    Param(name="scale_h", default=32.0, positive=True, doc="rope_interpolation_scale[1]"),
    Param(name="scale_w", default=32.0, positive=True, doc="rope_interpolation_scale[2]"),
    Param(name="patch_t", default=1.0, positive=True, doc="patch_size_t"),
    Param(name="patch", default=1.0, positive=True, doc="patch_size"),
]
GRID = GridAngles(
    axes=["f", "h", "w"],
    sizes=["frames", "height", "width"],
    coordinates=[
        f * scale_t * patch_t * sp.UnevaluatedExpr(1 / base_frames),
        h * scale_h * patch * sp.UnevaluatedExpr(1 / base_height),
        w * scale_w * patch * sp.UnevaluatedExpr(1 / base_width),
    ],
    frequency=sp.pi / 2 * theta**linspace,
    angle=freq * (2 * coord - 1),
)


def ltx_rotary_apply(x: torch.Tensor, grid: torch.Tensor, theta: float, tables: bool):
    """diffusers' tables from the fp32 grid coordinates [B, S, 3] (LTXVideoRotaryPosEmbed after its
    coordinates), applied to x in float64; with ``tables``, the (cos, sin) tables themselves."""
    dim, device = x.shape[-1], x.device
    freqs = theta ** torch.linspace(
        math.log(1.0, theta), math.log(theta, theta), dim // 6, device=device, dtype=torch.float32
    )
    freqs = (freqs * math.pi / 2.0) * (grid.unsqueeze(-1) * 2 - 1)
    freqs = freqs.transpose(-1, -2).flatten(2)
    cos, sin = freqs.cos().repeat_interleave(2, dim=-1), freqs.sin().repeat_interleave(2, dim=-1)
    pad = torch.zeros(*cos.shape[:2], dim % 6, device=device)  # diffusers' padding (C < 6 included)
    cos, sin = torch.cat([pad + 1, cos], dim=-1), torch.cat([pad, sin], dim=-1)
    if tables:
        return cos, sin
    pairs = x.double().unflatten(-1, (-1, 2))
    rotated = torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)
    return x.double() * cos.double() + rotated * sin.double()


def rope3d_ref(
    x: torch.Tensor,
    frames: int = 1,
    height: int = 1,
    width: int = 1,
    theta: float = 10000.0,
    base_frames: float = 20.0,
    base_height: float = 2048.0,
    base_width: float = 2048.0,
    scale_t: float = 8 / 25,
    scale_h: float = 32.0,
    scale_w: float = 32.0,
    patch_t: float = 1.0,
    patch: float = 1.0,
    tables: bool = False,
) -> torch.Tensor:
    """The tables as diffusers builds them (fp32, on x's device), applied in float64; with
    ``tables``, the (cos, sin) tables themselves."""
    grid = torch.stack(
        torch.meshgrid(
            *(torch.arange(n, dtype=torch.float32, device=x.device) for n in (frames, height, width)),
            indexing="ij",
        ),
        dim=0,
    )
    grid = grid.unsqueeze(0).repeat(x.shape[0], 1, 1, 1, 1)
    grid[:, 0:1] = grid[:, 0:1] * scale_t * patch_t / base_frames
    grid[:, 1:2] = grid[:, 1:2] * scale_h * patch / base_height
    grid[:, 2:3] = grid[:, 2:3] * scale_w * patch / base_width
    return ltx_rotary_apply(x, grid.flatten(2, 4).transpose(1, 2), theta, tables)


_TABLES: dict = {}
APPLY_ROTARY_EMB = next(iter(load_spec("rope_apply").peers.values()))  # diffusers' apply_rotary_emb


def diffusers_apply_rotary_emb(x: torch.Tensor, *params) -> torch.Tensor:
    """What LTX-Video runs per attention call: apply_rotary_emb with the two fp32 [B, S, C] tables
    that LTXVideoRotaryPosEmbed builds once per forward (built once here, not timed)."""
    key = (tuple(x.shape), x.device, params)
    if key not in _TABLES:
        _TABLES.clear()
        _TABLES[key] = rope3d_ref(x, *params, tables=True)
    return APPLY_ROTARY_EMB(x, *_TABLES[key])


spec = OpSpec(
    name="rope3d",
    summary="LTX-Video 3D rotary embedding with the angles computed in the kernel from the latent grid",
    tensors=[
        Tensor(
            name="x",
            dims="*rows hidden",
            doc="[B, S, C], S = frames·height·width (q or k before the head split)",
        ),
        Tensor(name="out", dims="*rows hidden", role="output"),
    ],
    params=PARAMS,
    structure=Rotary(
        pairing="interleaved",
        rotates=["x"],
        grid=GRID,
        conventions=[
            Convention(
                name="single_rounding",
                outputs={"out": x * cos + sign * x_pair * sin},
                matches="diffusers LTXVideoRotaryPosEmbed + apply_rotary_emb: fp32 angles, fp32 math, one "
                "rounding",
            ),
        ],
    ),
    reference=rope3d_ref,
    peers={"eager (diffusers apply_rotary_emb, fp32 tables)": diffusers_apply_rotary_emb},
)
