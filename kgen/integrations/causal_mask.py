"""A Qwen3 model's causal mask left to SDPA's `is_causal` under torch.compile too, as eager leaves it.

transformers' `create_causal_mask` returns no mask for SDPA (the attention then runs with `is_causal=True`, on
the flash kernel) where no token is padded, no sequence is packed and the queries are the keys' positions.
It checks the positions for packing by their values, so while dynamo traces (torch.compile) it cannot, and
it materializes a [B, 1, T, T] boolean mask for every call without a cache: a prefill with use_cache=False,
a training step. At Qwen3-8B's 2048-token prefill that attention took 7.9 ms where eager's took 3.0 (H100,
torch 2.11; BENCHMARKS.md), more than all of kgen's ops save under torch.compile.

What the positions are is known without their values where the caller gives none: the model makes them
consecutive (0, 1, …), and nothing is packed. So for a call with no attention mask, no position ids and no
cache (a fresh one made by the model, if any, is empty: the queries are the keys), a forward pre-hook on the
model hands it the mask it would have made in eager, none, as a prepared mask mapping (Qwen3Model takes
``attention_mask`` as {layer type: mask}, as `generate` prepares it). Every other call is the model's own.
Only models whose attention implementation is "sdpa" and that have no sliding-window layers. A caller that
passes an attention mask (`generate`, a collator's all-ones mask) keeps the materialized one under compile:
its values cannot be read while tracing, by transformers or here."""

from __future__ import annotations

from .decoder import class_path

CLASSES = {"transformers.models.qwen3.modeling_qwen3.Qwen3Model"}
SERVED = "causal mask left to SDPA's is_causal without a mask, positions or cache (torch.compile too)"


def serve(model) -> dict[str, str]:
    """Hooks every Qwen3Model in ``model`` (once); returns {its name: SERVED}."""
    served = {}
    for name, module in model.named_modules():
        if class_path(type(module)) not in CLASSES:
            continue
        if not getattr(module, "kgen_causal_mask", False):
            module.register_forward_pre_hook(_no_mask, with_kwargs=True)
            module.kgen_causal_mask = True
        served[name] = SERVED
    return served


def _no_mask(module, args, kwargs):
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    given = (kwargs.get(k) is not None for k in ("attention_mask", "position_ids"))
    if len(args) > 1 or any(given) or cache is not None or module.has_sliding_layers:
        return None
    if module.config._attn_implementation != "sdpa":
        return None
    return args, kwargs | {"attention_mask": {"full_attention": None}}
