"""The residual adds of a transformers decoder layer (Llama, Qwen3) fused with the RMSNorm after each, by
kgen's fused_add_rmsnorm (what `kernelize` does when its ops name it).

A decoder layer runs `residual + attention`, post_attention_layernorm, the MLP, then `residual + mlp`. Its
kgen forward does the first add and norm in one pass and hands the second add on, unmade, as a `PendingAdd`:
the next layer does it with its input_layernorm in one pass. So a layer's two adds and two norms are two
kernels that each read two [tokens, hidden] tensors and write two, where they were four kernels moving ten
(an add reads two and writes one, a norm reads one and writes one); torch.compile alone fuses each add with
its norm the same way, but not with kgen's norm, an op it cannot see into. The last layer of the model, a
layer whose output a forward hook observes (transformers' `output_hidden_states` records the layers'
outputs by hooks, and FSDP wraps a layer in hooks) and a layer run under gradient checkpointing (whose
reentrant form differentiates only tensor arguments) return the sum as a tensor, as the model's own layer
does. Numerics: the model's roundings (the sum in the model dtype, then LlamaRMSNorm / Qwen3RMSNorm: fp32
statistics, the normed value rounded to the dtype, then the weight): the same bits."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

from torch.nn.modules import module as _torch_module

_LLAMA, _QWEN3 = (
    "transformers.models.llama.modeling_llama.Llama",
    "transformers.models.qwen3.modeling_qwen3.Qwen3",
)
CLASSES = {f"{m}DecoderLayer": f"{m}RMSNorm" for m in (_LLAMA, _QWEN3)}  # layer class: its norms' class
OP = "fused_add_rmsnorm"


class PendingAdd(NamedTuple):
    """A decoder layer's output whose last residual add (residual + mlp) the next layer's norm does; what a
    caller of a layer on its own (outside the model's loop) gets where it had a tensor: their sum."""

    residual: Any
    mlp: Any


def fuse(model, load_op: Callable[[], Callable]) -> dict[str, str]:
    """Makes every Llama / Qwen3 decoder layer of ``model`` whose two norms are the model's RMSNorm an
    instance of a subclass of its class whose forward (below) calls ``load_op()``'s fused_add_rmsnorm; a layer
    hands its last add on only to such a layer. A subclass, not a forward set on the instance: transformers'
    gradient checkpointing wraps the forward of each subclass of its layers (in versions that do not wrap
    __call__). Returns {norm module name: what now computes it} for the norms fused with the add before
    them; {} where the model has no such layer."""
    layers = [(n, m, _fusable(m)) for n, m in model.named_modules() if class_path(model_class(m)) in CLASSES]
    if not any(fusable for *_, fusable in layers):
        return {}
    fused_add_rmsnorm, served, classes = load_op(), {}, {}
    for i, (name, layer, fusable) in enumerate(layers):
        if not fusable:
            continue
        base = model_class(layer)
        if base not in classes:
            body = {"forward": _forward(fused_add_rmsnorm), "kgen_base": base, "__module__": __name__}
            classes[base] = type(base.__name__, (base,), body)
        layer.__class__ = classes[base]
        layer.kgen_hands_on = i + 1 < len(layers) and layers[i + 1][2]  # only to a layer that takes it
        served[f"{name}.post_attention_layernorm"] = f"{OP} (with the attention's residual add)"
        if i and layers[i - 1][2]:
            served[f"{name}.input_layernorm"] = f"{OP} (with the layer before's residual add)"
    return served


def model_class(module) -> type:
    """The model's own class of ``module`` (the class kgen's subclass replaced, if it did)."""
    return getattr(type(module), "kgen_base", type(module))


def class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _fusable(layer) -> bool:
    norms = [getattr(layer, n, None) for n in ("input_layernorm", "post_attention_layernorm")]
    return all(class_path(type(n)) == CLASSES[class_path(model_class(layer))] for n in norms) and all(
        hasattr(layer, n) for n in ("self_attn", "mlp")
    )


def _forward(fused_add_rmsnorm):
    def forward(self, hidden_states, **kwargs):
        """LlamaDecoderLayer / Qwen3DecoderLayer's dataflow (every argument but the hidden states goes to the
        attention by name, as the model's layer passes it) with each residual add fused with the norm
        after it; the layer before's last add comes as a PendingAdd."""
        if isinstance(hidden_states, PendingAdd):
            norm = self.input_layernorm
            normed, residual = fused_add_rmsnorm(
                hidden_states.mlp,
                hidden_states.residual,
                norm.weight,
                norm.variance_epsilon,
                convention="transformers",
            )
        else:
            residual, normed = hidden_states, self.input_layernorm(hidden_states)
        attended = self.self_attn(hidden_states=normed, **kwargs)[0]
        norm = self.post_attention_layernorm
        normed, residual = fused_add_rmsnorm(
            attended, residual, norm.weight, norm.variance_epsilon, convention="transformers"
        )
        mlp = self.mlp(normed)
        observed = self._forward_hooks or _torch_module._global_forward_hooks
        # (not asking whether grad is enabled: the reentrant checkpoint runs the layer's forward without it)
        checkpointed = getattr(self, "gradient_checkpointing", False) and self.training
        if self.kgen_hands_on and not observed and not checkpointed:
            return PendingAdd(residual, mlp)
        return residual + mlp

    return forward
