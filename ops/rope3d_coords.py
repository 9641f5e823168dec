"""LTX-Video's 3D rotary embedding from given per-token coordinates (diffusers'
`LTXVideoRotaryPosEmbed(..., video_coords=...)`): coords [B, 3, S] in float32 replace the latent
grid, g = coords / (base_frames, base_height, base_width); the angles are computed in the kernel as
in rope3d.

Order: reference, the implementations it replaces, then the spec.
"""

import sympy as sp
import torch

from kgen.catalog import load_spec
from kgen.dsl import Convention, OpSpec, Tensor
from kgen.families.rotary import GridAngles, Rotary, cos, sign, sin

ROPE3D = load_spec("rope3d")  # the same frequencies, angles and base sizes
ltx_rotary_apply = ROPE3D.reference.__globals__["ltx_rotary_apply"]
x, x_pair, f, h, w = sp.symbols("x x_pair f h w")
base_frames, base_height, base_width = sp.symbols("base_frames base_height base_width")


def rope3d_coords_ref(
    x: torch.Tensor,
    coords: torch.Tensor,
    theta: float = 10000.0,
    base_frames: float = 20.0,
    base_height: float = 2048.0,
    base_width: float = 2048.0,
    tables: bool = False,
):
    """The tables diffusers builds from video_coords (fp32), applied in float64."""
    grid = torch.stack(
        [coords[:, 0] / base_frames, coords[:, 1] / base_height, coords[:, 2] / base_width], dim=-1
    )
    return ltx_rotary_apply(x, grid, theta, tables)


_TABLES: dict = {}
APPLY_ROTARY_EMB = next(iter(load_spec("rope_apply").peers.values()))  # diffusers' apply_rotary_emb


def diffusers_apply_rotary_emb(x: torch.Tensor, coords: torch.Tensor, *params) -> torch.Tensor:
    """apply_rotary_emb with the fp32 tables built from video_coords once (not timed)."""
    key = (tuple(x.shape), coords.data_ptr(), params)
    if key not in _TABLES:
        _TABLES.clear()
        _TABLES[key] = rope3d_coords_ref(x, coords, *params, tables=True)
    return APPLY_ROTARY_EMB(x, *_TABLES[key])


spec = OpSpec(
    name="rope3d_coords",
    summary="LTX-Video 3D rotary embedding from given video coordinates, angles computed in the kernel",
    tensors=[
        Tensor(name="x", dims="*rows hidden", doc="[B, S, C] (q or k before the head split)"),
        Tensor(
            name="coords", dims="batch axes tokens", dtype="float32", doc="video_coords: [B, 3, S] float32"
        ),
        Tensor(name="out", dims="*rows hidden", role="output"),
    ],
    params=[p for p in ROPE3D.params if p.name in ("theta", "base_frames", "base_height", "base_width")],
    structure=Rotary(
        pairing="interleaved",
        rotates=["x"],
        grid=GridAngles(
            axes=["f", "h", "w"],
            coordinates_input="coords",
            coordinates=[
                f * sp.UnevaluatedExpr(1 / base_frames),
                h * sp.UnevaluatedExpr(1 / base_height),
                w * sp.UnevaluatedExpr(1 / base_width),
            ],
            frequency=ROPE3D.structure.grid.frequency,
            angle=ROPE3D.structure.grid.angle,
        ),
        conventions=[
            Convention(
                name="single_rounding",
                outputs={"out": x * cos + sign * x_pair * sin},
                matches="diffusers LTXVideoRotaryPosEmbed(video_coords=...) + apply_rotary_emb: fp32 angles, "
                "one rounding",
            ),
        ],
    ),
    reference=rope3d_coords_ref,
    peers={"eager (diffusers apply_rotary_emb, fp32 tables from video_coords)": diffusers_apply_rotary_emb},
)
