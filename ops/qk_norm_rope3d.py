"""LTX-Video's q/k RMSNorm across heads (`torch.nn.RMSNorm(heads · head_dim)`: self-attention's norm_q and
norm_k over the [B, S, C] projections) and its 3D rotary embedding (rope3d: angles in the kernel from the
latent grid, in diffusers' fp32 steps) in one pass: q and k are read once and written once, instead of read
twice and written twice by rmsnorm and rope3d_qk. A token's C channels are one rotary head: its sum runs
across the threads of a block that hold it (C = 2048 in bf16: 256 threads, 8 warps). The norm rounds to the
I/O dtype as the RMSNorm's output does, then the rotation rounds once. Its backward is derived: the incoming
gradients rotated by -θ, then the norm's backward (q and k read again, both weights' gradients summed over
every token).

Order: reference, the implementations it replaces, then the spec.
"""

import torch
from _torch_rms_norm import EPS, torch_rms_norm

from kgen.catalog import load_spec
from kgen.dsl import Convention, OpSpec, Tensor
from kgen.families.rotary import Rotary

ROPE3D_QK = load_spec("rope3d_qk")  # the same grid angles, params and rotation of q and k
rope3d_qk_ref = ROPE3D_QK.reference
diffusers_rope3d_qk = next(iter(ROPE3D_QK.peers.values()))
rmsnorm_ref = load_spec("rmsnorm").reference  # float64 x · rsqrt(mean(x²) + eps) · weight over the last dim


def qk_norm_rope3d_ref(
    x: torch.Tensor,
    k: torch.Tensor,
    x_weight: torch.Tensor,
    k_weight: torch.Tensor,
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
    eps: float = 1e-6,
):
    """q and k normalized over C as torch.nn.RMSNorm outputs them (rounded to their dtype), then rotated in
    float64 by the tables LTXVideoRotaryPosEmbed builds."""
    grid = frames, height, width, theta, base_frames, base_height, base_width
    rope = (*grid, scale_t, scale_h, scale_w, patch_t, patch)
    normed = rmsnorm_ref(x, x_weight, eps).to(x.dtype), rmsnorm_ref(k, k_weight, eps).to(k.dtype)
    return rope3d_qk_ref(*normed, *rope)


def diffusers_qk_norm_rope3d(x, k, x_weight, k_weight, *params):
    """What LTX-Video runs per self-attention: norm_q and norm_k (torch.nn.RMSNorm, F.rms_norm), then
    apply_rotary_emb on q and k with the fp32 tables (built once, not timed)."""
    *rope, eps = params
    rms = torch.nn.functional.rms_norm
    x, k = rms(x, x.shape[-1:], x_weight, eps), rms(k, k.shape[-1:], k_weight, eps)
    return diffusers_rope3d_qk(x, k, *rope)


spec = OpSpec(
    name="qk_norm_rope3d",
    summary="LTX-Video q/k RMSNorm across heads and 3D rotary embedding in one pass, angles from the grid",
    tensors=[
        Tensor(name="x", dims="*rows hidden", doc="q: [B, S, C] before its norm, S = frames·height·width"),
        Tensor(name="k", dims="*rows hidden", doc="k: [B, S, C] before its norm"),
        Tensor(name="x_weight", dims="hidden", doc="norm_q's weight [C]"),
        Tensor(name="k_weight", dims="hidden", doc="norm_k's weight [C]"),
        Tensor(name="out", dims="*rows hidden", role="output"),
        Tensor(name="k_out", dims="*rows hidden", role="output"),
    ],
    params=[*ROPE3D_QK.params, EPS],
    structure=Rotary(
        pairing="interleaved",
        rotates=["x", "k"],
        grid=ROPE3D_QK.structure.grid,
        norm=torch_rms_norm("head"),  # torch.nn.RMSNorm, rounded once to the dtype
        conventions=[
            Convention(
                name="single_rounding",
                outputs=ROPE3D_QK.structure.conventions[0].outputs,  # of the normed values
                matches="diffusers LTX-Video self-attention: torch.nn.RMSNorm across heads (rounded to the "
                "dtype), then LTXVideoRotaryPosEmbed + apply_rotary_emb: fp32 angles and math, one rounding",
            ),
        ],
    ),
    reference=qk_norm_rope3d_ref,
    peers={"eager (F.rms_norm, then diffusers apply_rotary_emb, fp32 tables)": diffusers_qk_norm_rope3d},
)
