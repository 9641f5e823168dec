"""Rotary embedding on interleaved pairs (2i, 2i + 1) for text models (GPT-J's rotate_every_two):
q [B, Hq, T, D] and k [B, Hkv, T, D] in one launch with cos and sin [B or 1, T, D] in the model dtype
(each pair's angle repeated on its two channels); an in-place form rotates q and k where they are.

Order: reference, the implementations it replaces, then the spec.
"""

import sympy as sp
import torch

from kgen.catalog import load_spec
from kgen.dsl import Convention, OpSpec, to_io_dtype
from kgen.families.rotary import Rotary, cos, sign, sin

ROPE = load_spec("rope")  # the same tensors: q, k, cos, sin -> out, k_out
x, x_pair, k, k_pair = sp.symbols("x x_pair k k_pair")


def rope_interleaved_ref(
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
        pairs = t.double().unflatten(-1, (-1, 2))
        rotated = torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)
        if convention == "single_rounding":
            return t.double() * cos.double() + rotated * sin.double()
        return (t.double() * cos.double()).to(t.dtype).double() + (rotated * sin.double()).to(
            t.dtype
        ).double()

    return rotate(x), rotate(k)


def gptj_apply_rotary_pos_emb(x: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """transformers GPT-J: tensor * cos + rotate_every_two(tensor) * sin, in the model dtype."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)

    def rotate_every_two(t):
        return torch.stack((-t[..., 1::2], t[..., ::2]), dim=-1).flatten(-2)

    return x * cos + rotate_every_two(x) * sin, k * cos + rotate_every_two(k) * sin


spec = OpSpec(
    name="rope_interleaved",
    summary="rotary embedding of q and k in one launch, interleaved pairs (GPT-J rotate_every_two)",
    tensors=ROPE.tensors,
    structure=Rotary(
        pairing="interleaved",
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
                matches="transformers GPT-J: each product in the model dtype, then the sum",
            ),
        ],
    ),
    reference=rope_interleaved_ref,
    peers={"eager (transformers GPT-J apply_rotary_pos_emb)": gptj_apply_rotary_pos_emb},
    inplace={"out": "x", "k_out": "k"},
)
