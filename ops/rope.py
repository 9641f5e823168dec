"""Rotary embedding of text models (transformers Llama / Qwen3 `apply_rotary_pos_emb`): pairs
(i, i + D/2) via rotate_half, q [B, Hq, T, D] and k [B, Hkv, T, D] in one launch with cos and sin
[B or 1, T, D] in the model dtype, read once per token for all heads.

Order: reference, the implementations it replaces, then the spec.
"""

import sympy as sp
import torch

from kgen.dsl import Convention, Layer, OpSpec, Tensor, to_io_dtype
from kgen.families.rotary import Rotary, cos, sign, sin

x, x_pair, k, k_pair = sp.symbols("x x_pair k k_pair")


def rope_ref(
    x: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    convention: str = "single_rounding",
):
    """float64 reference: (q_embed, k_embed)."""
    if convention not in ("single_rounding", "transformers"):
        raise ValueError(f"unknown convention {convention!r}")
    if x.dim() == 4 and cos.dim() == 3:
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)

    def rotate(t):
        first, second = t.double().chunk(2, dim=-1)
        rotated = torch.cat((-second, first), dim=-1)
        if convention == "single_rounding":
            return t.double() * cos.double() + rotated * sin.double()
        products = (
            (t.double() * cos.double()).to(t.dtype).double(),
            (rotated * sin.double()).to(t.dtype).double(),
        )
        return products[0] + products[1]

    return rotate(x), rotate(k)


def transformers_apply_rotary_pos_emb(x: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """transformers' apply_rotary_pos_emb(q, k, cos, sin) with unsqueeze_dim=1."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)

    def rotate_half(t):
        return torch.cat((-t[..., t.shape[-1] // 2 :], t[..., : t.shape[-1] // 2]), dim=-1)

    return x * cos + rotate_half(x) * sin, k * cos + rotate_half(k) * sin


def liger_rope(x: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Liger-Kernel's Triton rotate_half RoPE (what liger_rotary_pos_emb runs without grad), q and k in one
    launch."""
    from liger_kernel.ops import LigerRopeFunction  # lazily: liger-kernel is optional

    # In place: Liger rotates the [B, T, H, D] storage of q and k (in a transformers model they are
    # transposed views of the projections' outputs). From the bench's contiguous [B, H, T, D] inputs
    # it first copies them to that layout (its time here includes the copy; the inputs stay intact),
    # except where that transpose is already contiguous (T == 1 decode, or one head): there it
    # rotates the bench's x and k themselves, so repeated calls keep rotating them, as a user's call
    # would its own q and k (a copy here would double its traffic). Math in cos/sin's dtype.
    return LigerRopeFunction.apply(x, k, cos, sin)


spec = OpSpec(
    name="rope",
    summary="rotary embedding of q and k in one launch, rotate_half pairs (transformers "
    "apply_rotary_pos_emb)",
    tensors=[
        Tensor(name="x", dims="*rows hidden", doc="q: [B, Hq, T, D]"),
        Tensor(name="k", dims="*rows hidden", doc="k: [B, Hkv, T, D]"),
        Tensor(name="cos", dims="*rows hidden", broadcast=True, doc="[B or 1, T, D], the model dtype"),
        Tensor(name="sin", dims="*rows hidden", broadcast=True, doc="[B or 1, T, D], the model dtype"),
        Tensor(name="out", dims="*rows hidden", role="output"),
        Tensor(name="k_out", dims="*rows hidden", role="output"),
    ],
    structure=Rotary(
        pairing="half",
        rotates=["x", "k"],
        tables=("cos", "sin"),
        conventions=[
            Convention(
                name="single_rounding",
                outputs={"out": x * cos + sign * x_pair * sin, "k_out": k * cos + sign * k_pair * sin},
                matches="the rotation in fp32, rounded once",
            ),
            Convention(
                name="transformers",
                outputs={
                    "out": to_io_dtype(x * cos) + to_io_dtype(sign * x_pair * sin),
                    "k_out": to_io_dtype(k * cos) + to_io_dtype(sign * k_pair * sin),
                },
                matches="transformers apply_rotary_pos_emb: each product in the model dtype, then the sum",
            ),
        ],
    ),
    reference=rope_ref,
    peers={
        "eager (transformers apply_rotary_pos_emb)": transformers_apply_rotary_pos_emb,
        "Liger (LigerRopeFunction)": liger_rope,
    },
    inplace={"out": "x", "k_out": "k"},
    layers=[
        Layer(
            name="RotaryPosEmb",
            replaces=[
                "transformers.models.llama.modeling_llama.apply_rotary_pos_emb",
                "transformers.models.qwen3.modeling_qwen3.apply_rotary_pos_emb",
            ],
            forward_args=["q", "k", "cos", "sin", "unsqueeze_dim"],
            defaults={"unsqueeze_dim": 1},
            bind={"x": "q", "k": "k", "cos": "cos", "sin": "sin"},
            convention="transformers",
        ),
    ],
)
