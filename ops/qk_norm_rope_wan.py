"""Wan 2.x's q/k RMSNorm across heads (`torch.nn.RMSNorm(heads · head_dim)`: a self-attention's norm_q and
norm_k, over every head of a token) and its 3D rotary embedding (rope_wan: angles in the kernel from the
latent grid, in float64 as diffusers builds its tables) in one pass: q and k are read twice (the token's sum,
then the rotation, the second read mostly from L1/L2) and written once, instead of read twice and written
twice by two ops. The norm rounds to the I/O dtype as the RMSNorm's output does, then the rotation rounds
once. Its backward is derived: a first kernel per token (the incoming gradients rotated by -θ, the norm's
statistic and backward sum, the inputs' gradients), a second summing the weights' per-head channels.

Order: reference, the implementations it replaces, then the spec.
"""

import torch
from _torch_rms_norm import EPS, torch_rms_norm

from kgen.catalog import load_spec
from kgen.dsl import Convention, OpSpec, Tensor
from kgen.families.rotary import Rotary

ROPE_WAN = load_spec("rope_wan")  # the same grid angles and params
rope_wan_ref = ROPE_WAN.reference
diffusers_wan_rope = next(iter(ROPE_WAN.peers.values()))
rmsnorm_ref = load_spec("rmsnorm").reference  # float64 x · rsqrt(mean(x²) + eps) · weight over the last dim


def across_heads(t: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """torch.nn.RMSNorm of t [B, H, S, D] over every head of a token (weight [H·D]), as the module sees the
    [B, S, H·D] projection, rounded once to t's dtype; [B, S, C] over C."""
    if t.dim() < 4:
        return rmsnorm_ref(t, weight, eps).to(t.dtype)
    flat = t.transpose(1, 2).flatten(2)
    normed = rmsnorm_ref(flat, weight.flatten(), eps).to(t.dtype)
    return normed.unflatten(2, (t.shape[1], t.shape[3])).transpose(1, 2)


def qk_norm_rope_wan_ref(
    x: torch.Tensor,
    k: torch.Tensor,
    x_weight: torch.Tensor,
    k_weight: torch.Tensor,
    frames: int = 1,
    height: int = 1,
    width: int = 1,
    theta: float = 10000.0,
    dim_t: int = 44,
    dim_h: int = 42,
    dim_w: int = 42,
    eps: float = 1e-6,
):
    """q and k normalized across heads as torch.nn.RMSNorm outputs them (rounded to their dtype), then
    rotated in float64 by the tables WanRotaryPosEmbed builds."""
    normed = across_heads(x, x_weight, eps), across_heads(k, k_weight, eps)
    return rope_wan_ref(*normed, frames, height, width, theta, dim_t, dim_h, dim_w)


def diffusers_qk_norm_rope(x, k, x_weight, k_weight, *params):
    """What Wan runs per self-attention: norm_q and norm_k over [B, S, H·D] (torch.nn.RMSNorm, F.rms_norm),
    then apply_rotary_emb on q and k with the fp32 tables (built once, not timed)."""
    *rope, eps = params

    def norm(t, w):  # t: [B, H, S, D] viewing [B, S, H, D]; the norm over [B, S, H·D]
        flat = t.transpose(1, 2).flatten(2)
        return torch.nn.functional.rms_norm(flat, flat.shape[-1:], w, eps).unflatten(2, t.shape[1::2])

    return diffusers_wan_rope(norm(x, x_weight).transpose(1, 2), norm(k, k_weight).transpose(1, 2), *rope)


spec = OpSpec(
    name="qk_norm_rope_wan",
    summary="Wan 2.x q/k RMSNorm across heads and 3D rotary embedding in one pass, angles from the grid",
    tensors=[
        Tensor(name="x", dims="*rows hidden", doc="q: [B, H, S, D] before its norm, S = frames·height·width"),
        Tensor(name="k", dims="*rows hidden", doc="k: [B, H, S, D] before its norm"),
        Tensor(name="x_weight", dims="heads hidden", doc="norm_q's weight [H·D]"),
        Tensor(name="k_weight", dims="heads hidden", doc="norm_k's weight [H·D]"),
        Tensor(name="out", dims="*rows hidden", role="output"),
        Tensor(name="k_out", dims="*rows hidden", role="output"),
    ],
    params=[*ROPE_WAN.params, EPS],
    structure=Rotary(
        pairing="interleaved",
        rotates=["x", "k"],
        grid=ROPE_WAN.structure.grid,
        norm=torch_rms_norm("token"),  # torch.nn.RMSNorm, rounded once to the dtype
        conventions=[
            Convention(
                name="single_rounding",
                outputs=ROPE_WAN.structure.conventions[
                    0
                ].outputs,  # x·cos + sign·x_pair·sin, of the normed values
                matches="diffusers Wan self-attention: torch.nn.RMSNorm across heads (rounded to the dtype), "
                "then WanRotaryPosEmbed + apply_rotary_emb: float64 angles, fp32 tables, fp32 math, one "
                "rounding",
            ),
        ],
    ),
    reference=qk_norm_rope_wan_ref,
    peers={"eager (F.rms_norm across heads, then diffusers apply_rotary_emb)": diffusers_qk_norm_rope},
)
