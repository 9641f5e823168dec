"""A Qwen3 or Llama model's causal mask left to SDPA's `is_causal` under torch.compile, as eager leaves it.

transformers' `create_causal_mask` returns no mask for SDPA (the attention then runs with `is_causal=True`, on
the flash kernel) where no token is padded, no sequence is packed and the queries are the keys' positions.
It checks the positions for packing by their values, so while dynamo traces (torch.compile) it cannot, and
it materializes a [B, 1, T, T] boolean mask for every call without a cache: a prefill with use_cache=False,
a training step. At Qwen3-8B's 2048-token prefill that attention took 7.9 ms where eager's took 3.0 (H100,
torch 2.11; BENCHMARKS.md), more than all of kgen's ops save under torch.compile.

What the positions are is known without their values where the caller gives none: the model makes them
consecutive (0, 1, …), and nothing is packed. So for a call with no attention mask, no position ids and no
cache (a fresh one made by the model, if any, is empty: the queries are the keys), a forward pre-hook on the
model gives it the mask eager makes there, none. Qwen3Model takes it as a prepared mask mapping
(``attention_mask`` as {layer type: mask}, as `generate` prepares it). LlamaModel takes none, so the hook sets
a flag for the call (cleared by a forward hook) and the modeling file's `create_causal_mask` is a wrapper
that returns no mask while it is set, transformers' mask otherwise: a name of the modeling file replaced for
every model of it in the process, as the `rope` layer replaces `apply_rotary_pos_emb` (the flag is the
thread's; dynamo traces it). Every other call is the model's own. Only models whose attention implementation
is "sdpa" and that have no sliding-window layers. A caller that passes an attention mask (`generate`, a
collator's all-ones mask) keeps the materialized one under compile: its values cannot be read while tracing,
by transformers or here."""

from __future__ import annotations

import sys
import threading

from .decoder import class_path

# Qwen3Model takes a prepared mask mapping; LlamaModel takes none: a flag for its create_causal_mask
PREPARED = "transformers.models.qwen3.modeling_qwen3.Qwen3Model"
FLAGGED = "transformers.models.llama.modeling_llama.LlamaModel"
SERVED = "causal mask left to SDPA's is_causal without a mask, positions or cache (torch.compile too)"
_CALL = threading.local()  # .plain: a flagged model's call that needs no mask is running (in this thread)


def serve(model) -> dict[str, str]:
    """Hooks every Qwen3Model and LlamaModel in ``model`` (once); returns {its name: SERVED}."""
    served = {}
    for name, module in model.named_modules():
        path = class_path(type(module))
        if path not in (PREPARED, FLAGGED):
            continue
        if not getattr(module, "kgen_causal_mask", False):
            if path == PREPARED:
                module.register_forward_pre_hook(_no_mask, with_kwargs=True)
            else:
                _wrap_create_causal_mask(sys.modules[type(module).__module__])
                module.register_forward_pre_hook(_flag, with_kwargs=True)
                module.register_forward_hook(_unflag, always_call=True)
            module.kgen_causal_mask = True
        served[name] = SERVED
    return served


def _plain(module, args, kwargs) -> bool:
    """Whether this call needs no mask: sdpa, no sliding layers, no attention mask, position ids or cache."""
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    given = (kwargs.get(k) is not None for k in ("attention_mask", "position_ids"))
    if len(args) > 1 or any(given) or cache is not None or getattr(module, "has_sliding_layers", False):
        return False
    return module.config._attn_implementation == "sdpa"


def _no_mask(module, args, kwargs):
    if _plain(module, args, kwargs):
        return args, kwargs | {"attention_mask": {"full_attention": None}}
    return None


def _flag(module, args, kwargs):
    _CALL.plain = _plain(module, args, kwargs)


def _unflag(module, args, output):
    _CALL.plain = False


def _wrap_create_causal_mask(modeling) -> None:
    original = modeling.create_causal_mask
    if getattr(original, "kgen_original", None) is not None:
        return

    def create_causal_mask(*args, **kwargs):
        return None if getattr(_CALL, "plain", False) else original(*args, **kwargs)

    create_causal_mask.kgen_original = original
    modeling.create_causal_mask = create_causal_mask
