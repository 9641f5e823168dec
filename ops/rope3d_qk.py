"""LTX-Video's 3D rotary embedding of q and k in one launch: rope3d's angles (computed in the
kernel from the latent grid, once per token for both tensors) applied to q and k, [B, S, C] each.

Order: reference, the implementations it replaces, then the spec.
"""

import sympy as sp
import torch

from kgen.catalog import load_spec
from kgen.dsl import Convention, OpSpec, Tensor
from kgen.families.rotary import Rotary, cos, sign, sin

ROPE3D = load_spec("rope3d")  # the same params and grid angles
rope3d_ref = ROPE3D.reference
x, x_pair, k, k_pair = sp.symbols("x x_pair k k_pair")


def rope3d_qk_ref(x: torch.Tensor, k: torch.Tensor, *params, **named) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 reference: rope3d of each; with ``tables=True``, the (cos, sin) tables both share."""
    if named.get("tables"):
        return rope3d_ref(x, *params, **named)
    return rope3d_ref(x, *params, **named), rope3d_ref(k, *params, **named)


def diffusers_apply_rotary_emb_qk(x: torch.Tensor, k: torch.Tensor, *params):
    """LTX-Video's attention: apply_rotary_emb(query, tables) and apply_rotary_emb(key, tables)."""
    apply = next(iter(ROPE3D.peers.values()))
    return apply(x, *params), apply(k, *params)


spec = OpSpec(
    name="rope3d_qk",
    summary="LTX-Video 3D rotary embedding of q and k in one launch, angles computed in the kernel",
    tensors=[
        Tensor(name="x", dims="*rows hidden", doc="q: [B, S, C], S = frames·height·width"),
        Tensor(name="k", dims="*rows hidden", doc="k: [B, S, C]"),
        Tensor(name="out", dims="*rows hidden", role="output"),
        Tensor(name="k_out", dims="*rows hidden", role="output"),
    ],
    params=ROPE3D.params,
    structure=Rotary(
        pairing="interleaved",
        rotates=["x", "k"],
        grid=ROPE3D.structure.grid,
        conventions=[
            Convention(
                name="single_rounding",
                outputs={"out": x * cos + sign * x_pair * sin, "k_out": k * cos + sign * k_pair * sin},
                matches="diffusers LTXVideoRotaryPosEmbed + apply_rotary_emb on q and k",
            ),
        ],
    ),
    reference=rope3d_qk_ref,
    peers={"eager (diffusers apply_rotary_emb on q and k, fp32 tables)": diffusers_apply_rotary_emb_qk},
)
