"""Flux.1's q/k RMSNorm over each head (`torch.nn.RMSNorm(head_dim)`: an attention's norm_q and norm_k, or the
text stream's norm_added_q and norm_added_k) and its rotary embedding (rope_flux: angles in the kernel from
the ids, in float64 as diffusers builds its tables) in one pass: q and k are read once and written once,
instead of twice. The norm rounds to the I/O dtype as the RMSNorm's output does, then the rotation rounds
once. Its backward is derived: the rotation by -θ of the incoming gradients, then the norm's backward (q and
k read again, both weights' gradients summed over every head and token).

Order: reference, the implementations it replaces, then the spec.
"""

import torch
from _torch_rms_norm import EPS, torch_rms_norm

from kgen.catalog import load_spec
from kgen.dsl import Convention, OpSpec, Tensor
from kgen.families.rotary import Rotary

ROPE_FLUX = load_spec("rope_flux")  # the same grid angles and params
rope_flux_ref = ROPE_FLUX.reference
rmsnorm_ref = load_spec("rmsnorm").reference  # float64 x · rsqrt(mean(x²) + eps) · weight over the last dim
diffusers_flux_rope = next(iter(ROPE_FLUX.peers.values()))


def qk_norm_rope_flux_ref(
    x: torch.Tensor,
    k: torch.Tensor,
    x_weight: torch.Tensor,
    k_weight: torch.Tensor,
    positions: torch.Tensor,
    theta: float = 10000.0,
    dim_0: int = 16,
    dim_1: int = 56,
    dim_2: int = 56,
    eps: float = 1e-6,
):
    """q and k normalized as torch.nn.RMSNorm outputs them (rounded to their dtype), then rotated in float64
    by the tables FluxPosEmbed builds."""
    normed = rmsnorm_ref(x, x_weight, eps).to(x.dtype), rmsnorm_ref(k, k_weight, eps).to(k.dtype)
    return rope_flux_ref(*normed, positions, theta, dim_0, dim_1, dim_2)


def diffusers_qk_norm_rope(x, k, x_weight, k_weight, positions, *params):
    """What Flux runs per attention: norm_q and norm_k (torch.nn.RMSNorm, F.rms_norm), then apply_rotary_emb
    on q and k with the fp32 tables (built once, not timed)."""
    *rope, eps = params
    rms = torch.nn.functional.rms_norm
    x, k = rms(x, x.shape[-1:], x_weight, eps), rms(k, k.shape[-1:], k_weight, eps)
    return diffusers_flux_rope(x, k, positions, *rope)


spec = OpSpec(
    name="qk_norm_rope_flux",
    summary="Flux.1 q/k RMSNorm over each head and rotary embedding in one pass, angles from the ids",
    tensors=[
        Tensor(name="x", dims="*rows hidden", doc="q: [B, H, S, D] before its norm"),
        Tensor(name="k", dims="*rows hidden", doc="k: [B, H, S, D] before its norm"),
        Tensor(name="x_weight", dims="hidden", doc="q's norm weight [D] (norm_q or norm_added_q)"),
        Tensor(name="k_weight", dims="hidden", doc="k's norm weight [D] (norm_k or norm_added_k)"),
        *(t for t in ROPE_FLUX.tensors if t.name == "positions"),
        Tensor(name="out", dims="*rows hidden", role="output"),
        Tensor(name="k_out", dims="*rows hidden", role="output"),
    ],
    params=[*ROPE_FLUX.params, EPS],
    structure=Rotary(
        pairing="interleaved",
        rotates=["x", "k"],
        grid=ROPE_FLUX.structure.grid,
        norm=torch_rms_norm("head"),  # torch.nn.RMSNorm, rounded once to the dtype
        conventions=[
            Convention(
                name="single_rounding",
                outputs=ROPE_FLUX.structure.conventions[
                    0
                ].outputs,  # x·cos + sign·x_pair·sin, of the normed values
                matches="diffusers Flux attention: torch.nn.RMSNorm over head_dim (rounded to the dtype), "
                "then FluxPosEmbed + apply_rotary_emb: float64 angles, fp32 tables, fp32 math, one rounding",
            ),
        ],
    ),
    reference=qk_norm_rope_flux_ref,
    peers={"eager (F.rms_norm, then diffusers apply_rotary_emb, fp32 tables)": diffusers_qk_norm_rope},
)
