"""Flux.1's attention on kgen's kernels (kgen.integrations.flux): the processor every FluxAttention gets, and
what the patched pos_embed hands it instead of FluxPosEmbed's two fp32 tables."""

from __future__ import annotations

from typing import Any, NamedTuple

from ._diffusers_common import fuses_qk_norms


class Positions(NamedTuple):
    """What the patched pos_embed gives the blocks instead of the (cos, sin) tables: the ids, float32 as
    FluxPosEmbed reads them, as [1, 3, S] (a view of the [S, 3] ids)."""

    positions: Any


def positions_forward(self, ids):
    return Positions(ids.float().t()[None])


class Attention:
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
