"""Runs a diffusers Flux.1 transformer (`FluxTransformer2DModel`) on kgen's kernels: what
`kgen.integrations.diffusers.patch` does to one (it checks the model, builds and loads OPS, then applies).

Double blocks, both streams: norm1 / norm1_context (AdaLayerNormZero: LayerNorm without affine, then the
modulation from the timestep embedding's chunks) -> adaln_layernorm; the attention's gated residual add, norm2
and its modulation -> residual_adaln_layernorm (one pass over the residual stream); the feed-forwards'
GELU(approximate="tanh") -> gelu_tanh. Single blocks: norm (AdaLayerNormZeroSingle) -> adaln_layernorm,
act_mlp -> gelu_tanh in eager (under torch.compile torch's GELU, which compile writes straight into the
concatenation that follows). Every attention's norm_q, norm_k, norm_added_q, norm_added_k (torch.nn.RMSNorm
over head_dim) -> rmsnorm; norm_out (AdaLayerNormContinuous) -> adaln_layernorm. Numerics: diffusers' own
roundings (the ops' "diffusers" conventions; torch.nn.RMSNorm's for the q/k norms).

The rotary embedding: pos_embed (FluxPosEmbed) passes the ids on instead of building its two fp32 tables, and
every attention rotates q and k in one rope_flux launch (over [B, H, S, D] views of the [B, S, H, D] heads)
with the angles computed in the kernel from the ids, in float64 as FluxPosEmbed computes them. Where the q/k
norms are served (inference and training: qk_norm_rope_flux has a derived backward), each stream's q/k norms
and the rotation are one qk_norm_rope_flux launch instead (two in a double block: the text stream's and the
image's, then concatenated). Not served yet:
the residual adds that end each block (`+ gate · ff`, one add in the dtype each), which the next block's norm
could take, as the LTX-Video patch does."""

from __future__ import annotations

import functools
from types import MethodType
from typing import Any, NamedTuple

from ..errors import KgenError
from ._diffusers_common import fuses_qk_norms, gelu_forward, refuse_hooks, rms_forward

OPS = (
    "adaln_layernorm",
    "residual_adaln_layernorm",
    "rmsnorm",
    "gelu_tanh",
    "rope_flux",
    "qk_norm_rope_flux",
)
MODEL = "FluxTransformer2DModel"
QK_NORMS = ("norm_q", "norm_k", "norm_added_q", "norm_added_k")
PROCESSORS = ("FluxAttnProcessor", "_Attention")  # diffusers', or this module's from an earlier patch
DOUBLE = {
    "": "FluxTransformerBlock",
    "norm1": "AdaLayerNormZero",
    "norm1_context": "AdaLayerNormZero",
    "norm1.norm": "LayerNorm",
    "norm1_context.norm": "LayerNorm",
    "norm2": "LayerNorm",
    "norm2_context": "LayerNorm",
    "attn": "FluxAttention",
    "attn.processor": PROCESSORS,
    **{f"attn.{n}": "RMSNorm" for n in QK_NORMS},
    "ff.net.0": "GELU",
    "ff_context.net.0": "GELU",
}
SINGLE = {
    "": "FluxSingleTransformerBlock",
    "norm": "AdaLayerNormZeroSingle",
    "norm.norm": "LayerNorm",
    "act_mlp": "GELU",
    "attn": "FluxAttention",
    "attn.processor": PROCESSORS,
    "attn.norm_q": "RMSNorm",
    "attn.norm_k": "RMSNorm",
}


def apply(model, kernels: dict) -> dict[str, int]:
    """Patches a FluxTransformer2DModel that `check` accepted, in place, with ``kernels`` (OPS' loaded
    libraries); returns how many modules of each kind now run on kgen's kernels."""
    adaln = kernels["adaln_layernorm"].adaln_layernorm
    done = {
        "double_blocks": 0,
        "single_blocks": 0,
        "attentions": 0,
        "adaln_norms": 0,
        "qk_norms": 0,
        "gelu_tanh": 0,
    }
    for block in model.transformer_blocks:
        block.forward = MethodType(_double_forward(kernels["residual_adaln_layernorm"]), block)
        for norm in (block.norm1, block.norm1_context):
            norm.forward = MethodType(_zero_forward(adaln), norm)
        for ff in (block.ff, block.ff_context):
            ff.net[0].forward = MethodType(gelu_forward(kernels["gelu_tanh"]), ff.net[0])
        done["double_blocks"] += 1
        done["adaln_norms"] += 2
        done["gelu_tanh"] += 2
    for block in model.single_transformer_blocks:
        block.norm.forward = MethodType(_zero_forward(adaln), block.norm)
        block.act_mlp.forward = MethodType(_act_mlp_forward(kernels["gelu_tanh"]), block.act_mlp)
        done["single_blocks"] += 1
        done["adaln_norms"] += 1
        done["gelu_tanh"] += 1
    model.pos_embed.forward = MethodType(_positions_forward, model.pos_embed)
    dims = dict(zip(("dim_0", "dim_1", "dim_2"), model.pos_embed.axes_dim))
    dims["theta"] = float(model.pos_embed.theta)
    rope = functools.partial(kernels["rope_flux"].rope_flux, **dims)
    fused = functools.partial(kernels["qk_norm_rope_flux"].qk_norm_rope_flux, **dims)
    for attn in (m for m in model.modules() if type(m).__name__ == "FluxAttention"):
        attn.set_processor(_Attention(rope, fused, attn.processor))
        done["attentions"] += 1
        for name in QK_NORMS:
            if (norm := getattr(attn, name, None)) is not None:
                norm.forward = MethodType(rms_forward(kernels["rmsnorm"].rmsnorm), norm)
                done["qk_norms"] += 1
    model.norm_out.forward = MethodType(_continuous_forward(adaln), model.norm_out)
    done["adaln_norms"] += 1
    return done


def check(model) -> None:
    """Refuses a model whose structure differs from what `apply` serves, before anything changes."""
    refuse_hooks(model, MODEL)
    found = type(model.pos_embed).__name__
    if found != "FluxPosEmbed" or len(model.pos_embed.axes_dim) != 3:
        raise KgenError(
            f"{MODEL}.pos_embed: a {found} of {len(model.pos_embed.axes_dim)} axes, not a FluxPosEmbed of 3"
        )
    found = type(model.norm_out).__name__, type(getattr(model.norm_out, "norm", None)).__name__
    if found != ("AdaLayerNormContinuous", "LayerNorm"):
        raise KgenError(
            f"{MODEL}.norm_out: a {found[0]} of a {found[1]}, not an AdaLayerNormContinuous of a LayerNorm"
        )
    blocks = [(f"transformer_blocks.{i}", b, DOUBLE) for i, b in enumerate(model.transformer_blocks)]
    blocks += [
        (f"single_transformer_blocks.{i}", b, SINGLE) for i, b in enumerate(model.single_transformer_blocks)
    ]
    norms = [("norm_out.norm", model.norm_out.norm)]
    for where, block, structure in blocks:
        for path, wanted in structure.items():
            module = functools.reduce(getattr, path.split(".") if path else [], block)
            if type(module).__name__ not in (wanted if isinstance(wanted, tuple) else (wanted,)):
                wanted = wanted if isinstance(wanted, str) else wanted[0]
                raise KgenError(
                    f"{MODEL}.{where}{'.' * bool(path)}{path}: a {type(module).__name__}, not a {wanted}"
                )
            if wanted == "LayerNorm":
                norms.append((f"{where}.{path}", module))
            if wanted == "GELU" and module.approximate != "tanh":
                raise KgenError(
                    f"{MODEL}.{where}.{path}: GELU(approximate={module.approximate!r}), not 'tanh'"
                )
        for path in ("norm1", "norm1_context"):
            if getattr(block, path, None) is not None and getattr(block, path).emb is not None:
                raise KgenError(
                    f"{MODEL}.{where}.{path}: embeds class labels itself, which kgen's patch does not"
                )
    for where, norm in norms:
        if norm.weight is not None or norm.bias is not None:
            raise KgenError(f"{MODEL}.{where}: a LayerNorm with affine, which kgen's adaln ops do not apply")


class _Positions(NamedTuple):
    """What the patched pos_embed gives the blocks instead of the (cos, sin) tables: the ids, float32 as
    FluxPosEmbed reads them, as [1, 3, S] (a view of the [S, 3] ids)."""

    positions: Any


def _positions_forward(self, ids):
    return _Positions(ids.float().t()[None])


def _zero_forward(adaln):
    def forward(self, x, timestep=None, class_labels=None, hidden_dtype=None, emb=None):
        """AdaLayerNormZero(Single): the modulation's chunks from the embedding as diffusers computes them,
        then LayerNorm and `* (1 + scale) + shift` in one pass; the other chunks returned for the block."""
        chunks = self.linear(self.silu(emb)).chunk(self.linear.out_features // x.shape[-1], dim=1)
        shift, scale, *rest = chunks
        return adaln(x, scale[:, None], shift[:, None], self.norm.eps, convention="diffusers"), *rest

    return forward


def _act_mlp_forward(kernel):
    def forward(self, x):
        """A single block's act_mlp: kgen's gelu_tanh in eager; torch's while torch.compile traces, which
        writes it straight into the `cat([attention, mlp])` after it (kgen's output would be copied there)."""
        import torch

        if torch.compiler.is_compiling():
            return torch.nn.functional.gelu(x, approximate="tanh")
        return kernel.gelu_tanh(x)

    return forward


def _continuous_forward(adaln):
    def forward(self, x, conditioning_embedding):
        """AdaLayerNormContinuous (norm_out): scale, then shift, from the embedding; LayerNorm and modulation
        in one pass."""
        scale, shift = self.linear(self.silu(conditioning_embedding).to(x.dtype)).chunk(2, dim=1)
        return adaln(x, scale[:, None], shift[:, None], self.norm.eps, convention="diffusers")

    return forward


def _double_forward(kernel):
    residual_adaln = kernel.residual_adaln_layernorm

    def forward(
        self, hidden_states, encoder_hidden_states, temb, image_rotary_emb=None, joint_attention_kwargs=None
    ):
        """FluxTransformerBlock's dataflow in diffusers' roundings; each stream's gated residual add after the
        attention fused with norm2 and its modulation."""
        import torch

        normed, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.norm1(hidden_states, emb=temb)
        normed_context, c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp = self.norm1_context(
            encoder_hidden_states, emb=temb
        )
        attended, attended_context = self.attn(
            hidden_states=normed,
            encoder_hidden_states=normed_context,
            image_rotary_emb=image_rotary_emb,
            **(joint_attention_kwargs or {}),
        )
        normed, hidden_states = residual_adaln(
            hidden_states,
            attended,
            scale_mlp[:, None],
            shift_mlp[:, None],
            gate_msa[:, None],
            self.norm2.eps,
            convention="diffusers",
        )
        hidden_states = hidden_states + gate_mlp.unsqueeze(1) * self.ff(normed)
        normed_context, encoder_hidden_states = residual_adaln(
            encoder_hidden_states,
            attended_context,
            c_scale_mlp[:, None],
            c_shift_mlp[:, None],
            c_gate_msa[:, None],
            self.norm2_context.eps,
            convention="diffusers",
        )
        encoder_hidden_states = encoder_hidden_states + c_gate_mlp.unsqueeze(1) * self.ff_context(
            normed_context
        )
        if encoder_hidden_states.dtype == torch.float16:
            encoder_hidden_states = encoder_hidden_states.clip(-65504, 65504)
        return encoder_hidden_states, hidden_states

    return forward


class _Attention:
    """A Flux attention processor: diffusers' dataflow (projections, q/k norms, the text stream's own
    projections and norms put before the image's, rotary on both, attention dispatch, output projections) with
    q and k rotated by kgen's rope_flux in one launch, seen as [B, H, S, D] views, from the ids the patched
    pos_embed passes on. Where the q/k norms are served (gradient wanted or not), each stream's q/k norms and
    its rotation are one qk_norm_rope_flux launch (the text stream's with its positions, the first ones),
    before the concatenation."""

    def __init__(self, rope, fused, original):
        self.rope, self.fused = rope, fused
        self._attention_backend = getattr(original, "_attention_backend", None)
        self._parallel_config = getattr(original, "_parallel_config", None)

    def normed_rotation(self, q, k, norm_q, norm_k, positions):
        """One stream's q and k ([B, S, H, D]) normalized and rotated in one launch (over [B, H, S, D]
        views)."""
        rotated = self.fused(
            q.transpose(1, 2), k.transpose(1, 2), norm_q.weight, norm_k.weight, positions, eps=norm_q.eps
        )
        return tuple(t.transpose(1, 2) for t in rotated)

    def __call__(
        self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None
    ):
        import torch
        from diffusers.models.attention_dispatch import dispatch_attention_fn
        from diffusers.models.transformers.transformer_flux import _get_qkv_projections

        def heads(t):
            return t.unflatten(-1, (-1, attn.head_dim))

        q, k, v, text_q, text_k, text_v = _get_qkv_projections(attn, hidden_states, encoder_hidden_states)
        q, k, v = heads(q), heads(k), heads(v)
        joint = attn.added_kv_proj_dim is not None  # the text stream's tokens go first
        norms = [(attn.norm_q, attn.norm_k)] + ([(attn.norm_added_q, attn.norm_added_k)] if joint else [])
        if image_rotary_emb is not None and all(fuses_qk_norms(q, *pair) for pair in norms):
            # the ids [1, 3, S], the same for every batch and head: the text's first
            positions = image_rotary_emb.positions.to(q.device).expand(q.shape[0], -1, -1)
            split = text_q.shape[1] if joint else 0
            streams = [(q, k, *norms[0], positions[..., split:])]
            if joint:
                streams.insert(0, (heads(text_q), heads(text_k), *norms[1], positions[..., :split]))
            rotated = [self.normed_rotation(*stream) for stream in streams]
            q, k = (torch.cat(parts, dim=1) if joint else parts[0] for parts in zip(*rotated))
            v = torch.cat([heads(text_v), v], dim=1) if joint else v
        else:
            q, k = attn.norm_q(q), attn.norm_k(k)
            if joint:
                q = torch.cat([attn.norm_added_q(heads(text_q)), q], dim=1)
                k = torch.cat([attn.norm_added_k(heads(text_k)), k], dim=1)
                v = torch.cat([heads(text_v), v], dim=1)
            if image_rotary_emb is not None:  # the ids [1, 3, S], the same for every batch and head
                positions = image_rotary_emb.positions.to(q.device).expand(q.shape[0], -1, -1)
                rotated = self.rope(q.transpose(1, 2), k.transpose(1, 2), positions)
                q, k = (t.transpose(1, 2) for t in rotated)
        out = dispatch_attention_fn(
            q,
            k,
            v,
            attn_mask=attention_mask,
            backend=self._attention_backend,
            parallel_config=self._parallel_config,
        )
        out = out.flatten(2, 3).to(q.dtype)
        if encoder_hidden_states is None:
            return out
        text, image = out.split_with_sizes([encoder_hidden_states.shape[1], hidden_states.shape[1]], dim=1)
        return attn.to_out[1](attn.to_out[0](image.contiguous())), attn.to_add_out(text.contiguous())
