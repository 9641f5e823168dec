"""A decode step's attention on the grouped k/v heads, for Qwen3 and Llama models (what `kernelize` does
unless ``grouped_decode=False``).

At one query token with a mask (a static cache's decode step) transformers' SDPA path copies the cache's keys
and values out to every query head (`repeat_kv`: on transformers < 5.24, and under torch.compile on any): at
Qwen3-8B's decode, batch 64, 512 of context, 9.3 of a compiled step's 25.3 ms on an H100 (BENCHMARKS.md). A
served attention runs one SDPA call with each k/v head's query heads as its rows instead, the mask (one per
batch entry) every row's: the same scores, softmax and sums without the copy (not bitwise the copy's; as close
to float64). The attention modules take their function by name from their modeling file's
ALL_ATTENTION_FUNCTIONS; that name becomes a view of transformers' registry whose "sdpa" entry takes this path
for a served module's masked decode step and is transformers' function for every other call and module (every
model of the file in the process reaches the same registry). Prefill, training, no mask (SDPA's enable_gqa
serves it), another implementation, dropout or scores asked for: the model's function."""

from __future__ import annotations

import sys

import torch.nn.functional as F

from .decoder import class_path, model_class

_MODELS = "transformers.models"
CLASSES = (f"{_MODELS}.qwen3.modeling_qwen3.Qwen3Attention", f"{_MODELS}.llama.modeling_llama.LlamaAttention")
SERVED = "decode steps attend on the grouped k/v heads (SDPA without repeat_kv)"


def serve(model, grouped: bool = True) -> dict[str, str]:
    """Marks every Qwen3 and Llama attention of ``model`` with grouped k/v heads as served (or not, with
    ``grouped`` False) and puts the registry view in its modeling file (once); returns {its name: SERVED}."""
    served = {}
    for name, module in model.named_modules():
        base = model_class(module)
        if class_path(base) not in CLASSES or getattr(module, "num_key_value_groups", 1) <= 1:
            continue
        modeling = sys.modules[base.__module__]
        if not isinstance(modeling.ALL_ATTENTION_FUNCTIONS, _Registry):
            modeling.ALL_ATTENTION_FUNCTIONS = _Registry(modeling.ALL_ATTENTION_FUNCTIONS)
        modeling.ALL_ATTENTION_FUNCTIONS["sdpa"]  # its wrapper made now, not while dynamo traces a call
        module.kgen_grouped_decode = grouped
        served |= {name: SERVED} if grouped else {}
    return served


class _Registry:
    """transformers' attention registry as a modeling file sees it: its "sdpa" entry grouped for served
    modules, everything else the registry's own."""

    def __init__(self, registry):
        self.kgen_original = registry
        self._wrapped: dict = {}

    def get_interface(self, name, default):
        return self._grouped(name, self.kgen_original.get_interface(name, default))

    def __getitem__(self, name):
        return self._grouped(name, self.kgen_original[name])

    def __getattr__(self, name):
        return getattr(self.kgen_original, name)

    def _grouped(self, name, function):
        if name != "sdpa":
            return function
        if function not in self._wrapped:

            def attention(module, query, key, value, attention_mask, *args, **kwargs):
                if getattr(module, "kgen_grouped_decode", False) and not args:
                    if _grouped_decode(query, key, attention_mask, kwargs):
                        return _attend_grouped(query, key, value, attention_mask, kwargs.get("scaling")), None
                return function(module, query, key, value, attention_mask, *args, **kwargs)

            self._wrapped[function] = attention
        return self._wrapped[function]


def _grouped_decode(q, k, mask, kwargs) -> bool:
    """Whether this SDPA call is a decode step SDPA would run on k/v copied out to every query head: one query
    token, grouped k/v heads, a mask shared by the heads, no dropout, nothing else that changes SDPA's call
    (scores asked for, a soft cap, a position bias)."""
    heads, kv_heads = q.shape[1], k.shape[1]
    return (
        q.shape[2] == 1
        and kv_heads < heads
        and heads % kv_heads == 0
        and mask is not None
        and mask.dim() == 4
        and mask.shape[1] == mask.shape[2] == 1
        and not kwargs.get("dropout")
        and not any(kwargs.get(n) for n in ("output_attentions", "softcap", "position_bias"))
    )


def _attend_grouped(q, k, v, mask, scaling):
    """SDPA with each k/v head's group of query heads as its rows: [B, H, 1, D] queries as [B, H_kv, H / H_kv,
    D] (the heads of a group are consecutive, as repeat_kv repeats them), the [B, 1, 1, S] mask broadcast over
    them; returns [B, 1, H, D] as the model's attention function does."""
    batch, heads, _, dim = q.shape
    rows = q.reshape(batch, k.shape[1], heads // k.shape[1], dim)
    out = F.scaled_dot_product_attention(rows, k, v, attn_mask=mask, scale=scaling)
    return out.reshape(batch, heads, 1, v.shape[-1]).transpose(1, 2)
