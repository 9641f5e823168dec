"""Qwen3's attention with its q/k norms and the rotary embedding in one pass, by kgen's qk_norm_rope (what
`kernelize` does when its ops name it).

Qwen3Attention normalizes each head of q and k (q_norm, k_norm: Qwen3RMSNorm over head_dim) and then rotates
them (apply_rotary_pos_emb with the model's cos and sin): with kgen's RMSNorm that is q and k read and
written twice each, and torch.compile cannot fuse kgen's norm with the rotation (an op it cannot see into)
as it fuses its own. Each such attention becomes an instance of a subclass whose forward runs both as one
qk_norm_rope launch on q and k ([B, H, T, D] views of the projections, as the model passes them); the
projections, the cache update and the attention function stay the model's. Numerics: the model's roundings
(fp32 statistics, the normed value rounded to the dtype, then the weight; each rotation product in the dtype,
then the sum). Where a call does not fit the kernel (weights or tables in another dtype than q, the norms'
eps unequal, a head size the kernel does not serve), the norms and the rotation run as the model's."""

from __future__ import annotations

import sys
from typing import Callable

from ._rotary_fit import lanes_fit
from .decoder import class_path, model_class

_QWEN3 = "transformers.models.qwen3.modeling_qwen3.Qwen3"
CLASSES = {f"{_QWEN3}Attention": f"{_QWEN3}RMSNorm"}  # attention class: its q/k norms' class
OP = "qk_norm_rope"


def fuse(model, load_op: Callable[[], Callable]) -> dict[str, str]:
    """Makes every Qwen3 attention of ``model`` whose q_norm and k_norm are the model's RMSNorm an instance of
    a subclass of its class whose forward (below) calls ``load_op()``'s qk_norm_rope. Returns {norm module
    name: what now computes it}; {} where the model has no such attention."""
    found = [
        (n, m) for n, m in model.named_modules() if class_path(model_class(m)) in CLASSES and _fusable(m)
    ]
    if not found:
        return {}
    qk_norm_rope, served, classes = load_op(), {}, {}
    for name, attention in found:
        base = model_class(attention)
        if base not in classes:
            body = {"forward": _forward(qk_norm_rope), "kgen_base": base, "__module__": __name__}
            classes[base] = type(base.__name__, (base,), body)
        attention.__class__ = classes[base]
        for norm in ("q_norm", "k_norm"):
            served[f"{name}.{norm}"] = f"{OP} (with the rotary embedding)"
    return served


def _fusable(attention) -> bool:
    norms = [getattr(attention, n, None) for n in ("q_norm", "k_norm")]
    parts = ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "layer_idx", "config", "scaling")
    parts += ("attention_dropout", "sliding_window")
    return all(class_path(type(n)) == CLASSES[class_path(model_class(attention))] for n in norms) and all(
        hasattr(attention, p) for p in parts
    )


def _fits(attention, q, cos, sin) -> bool:
    """Whether this call's q (with its k), norms and tables are what qk_norm_rope serves: the weights and the
    tables in q's dtype, one eps, and a head size D the kernel serves (rotate_half pairs; _rotary_fit)."""
    norms = attention.q_norm, attention.k_norm
    return (
        all(n.weight.dtype == q.dtype for n in norms)
        and cos.dtype == sin.dtype == q.dtype
        and norms[0].variance_epsilon == norms[1].variance_epsilon
        and lanes_fit(q.shape[-1], q.element_size(), half_pairs=True)
    )


def _forward(qk_norm_rope):
    def forward(self, hidden_states, position_embeddings, attention_mask=None, *args, **kwargs):
        """Qwen3Attention's dataflow (projections to [B, H, T, D] views, the cache update, the model's
        attention function, the output projection) with q_norm, k_norm and the rotation as one qk_norm_rope.
        The cache comes as the model's layer passes it: by position, or by name (``cache`` from transformers
        5.24, ``past_key_values`` before)."""
        model_file = sys.modules[self.kgen_base.__module__]
        tokens = hidden_states.shape[:-1]
        heads = (*tokens, -1, self.head_dim)
        q, k, v = (
            p(hidden_states).view(heads).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        cos, sin = position_embeddings
        if _fits(self, q, cos, sin):
            norm = self.q_norm
            q, k = qk_norm_rope(
                q,
                k,
                norm.weight,
                self.k_norm.weight,
                cos,
                sin,
                norm.variance_epsilon,
                convention="transformers",
            )
        else:
            q, k = (n(t.transpose(1, 2)).transpose(1, 2) for n, t in ((self.q_norm, q), (self.k_norm, k)))
            q, k = model_file.apply_rotary_pos_emb(q, k, cos, sin)
        named = [kwargs.pop(n) for n in ("cache", "past_key_values") if n in kwargs]
        cache = args[0] if args else next((c for c in named if c is not None), None)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx, kwargs=kwargs)
        attend = model_file.ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, model_file.eager_attention_forward
        )
        out, weights = attend(
            self,
            q,
            k,
            v,
            attention_mask,
            dropout=self.attention_dropout if self.training else 0.0,
            scaling=self.scaling,
            sliding_window=self.sliding_window,
            **kwargs,
        )
        return self.o_proj(out.reshape(*tokens, -1).contiguous()), weights

    return forward
