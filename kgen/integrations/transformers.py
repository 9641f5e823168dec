"""Serves a transformers model's layers with kgen kernels through `kernels.kernelize`.

transformers marks its layers for `kernels` (Qwen3RMSNorm is `@use_kernel_forward_from_hub("RMSNorm")`)
only with the kernels versions it supports (0.16.x for transformers 5.17, where kgen needs 0.17). So kgen
marks the classes its specs' layers replace itself, with kernels' `replace_kernel_forward_from_hub`
(keeping a name transformers already gave), builds the projects and kernelizes with a mapping to them. No
transformers code is copied."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import Callable

from ..builder import PROGRESS, build_op, device_arch, load
from ..catalog import load_spec
from ..errors import KgenError
from . import attention, decoder
from .causal_mask import serve as serve_causal_mask
from .grouped_decode import serve as serve_grouped_decode

# RMSNorm everywhere, each decoder layer's residual adds fused with the norms after them
# (kgen.integrations.decoder), Qwen3's q/k norms fused with the rotary embedding (kgen.integrations.attention)
# and the SwiGLU MLP; "rope" (the rotation with no norm before it: Llama's) and "cross_entropy" on request
OPS = ("rmsnorm", "fused_add_rmsnorm", "qk_norm_rope", "silu_mul")
LOSSES = ("cross_entropy",)  # ops that serve the model's loss_function (a causal LM's), not a module


def kernelize(
    model,
    ops: tuple[str, ...] = OPS,
    *,
    arch: str | None = None,
    root: Path = Path("generated"),
    mode=None,
    causal_mask: bool = True,
    grouped_decode: bool = True,
    step: Callable[[str], None] = PROGRESS.info,
) -> dict[str, str]:
    """Replaces the forward of every module of ``model`` that a layer of ``ops`` replaces (and whose condition
    holds) with that layer's, from ``root/<op>-<arch>`` (written and built when missing or stale). Returns
    {module name or function path: "<op>.<layer>"} for what now runs on kgen; refuses a model none of whose
    modules is known.

    fused_add_rmsnorm serves the Llama / Qwen3 decoder layers' residual adds with the norms after them
    (kgen.integrations.decoder), reported per norm it fuses with an add (overriding "rmsnorm.RMSNorm");
    qk_norm_rope serves Qwen3's q_norm and k_norm with the rotary embedding after them
    (kgen.integrations.attention), reported per norm.

    An op of LOSSES ("cross_entropy") serves the model's loss_function instead (`causal_lm_loss`), reported
    as {"loss_function": ...}.

    ``causal_mask``: a Qwen3 or Llama model's causal mask left to SDPA's is_causal under torch.compile as in
    eager where the call makes that known (kgen.integrations.causal_mask), reported per decoder model.
    ``grouped_decode``: a Qwen3 or Llama attention's decode step attends on the grouped k/v heads, without
    transformers' copy of them to every head (kgen.integrations.grouped_decode), reported per attention.

    A layer that replaces a module-level function (rope's, for transformers' apply_rotary_pos_emb) puts
    kernels' module for it in the function's place, as transformers does with the kernels versions it
    supports: the model's code calls it by name, so once kernelized, every model of that modeling file in
    the process runs kgen's rope."""
    from kernels import (
        LocalLayerRepository,
        Mode,
        replace_kernel_forward_from_hub,
        use_kernel_forward_from_hub,
        use_kernel_mapping,
    )
    from kernels import kernelize as kernels_kernelize

    arch = arch or device_arch()
    classes = {f"{type(m).__module__}.{type(m).__qualname__}": type(m) for m in model.modules()}
    files = {type(m).__module__ for m in model.modules()}
    mapping, layers, functions, losses, fused = {}, {}, {}, {}, {}
    for op in (op for op in ops if op in LOSSES):
        if not hasattr(type(model), "loss_function"):
            raise KgenError(f"{type(model).__name__} has no loss_function for kgen's {op} to serve")
        library = load(build_op(op, arch, root, step))
        model.loss_function = causal_lm_loss(getattr(library, op))
        losses["loss_function"] = f"{op} (causal LM loss)"
    ops = tuple(op for op in ops if op not in LOSSES)
    for op in ops:
        for layer in load_spec(op).layers:
            found = {p: _replaced_by(p, classes, files) for p in layer.replaces}
            found = {p: target for p, target in found.items() if target is not None}
            if not found:
                continue
            repository = LocalLayerRepository(repo_path=build_op(op, arch, root, step), layer_name=layer.name)
            for path, target in found.items():
                if inspect.isclass(target):
                    name = getattr(target, "kernel_layer_name", None) or layer.name
                    replace_kernel_forward_from_hub(target, name, layer.condition)
                    layers[target] = f"{op}.{layer.name}"
                else:
                    function = target
                    if not hasattr(function, "kernel_layer_name"):
                        function = use_kernel_forward_from_hub(layer.name)(function)
                        where, attr = path.rsplit(".", 1)
                        setattr(sys.modules[where], attr, function)
                    model.__dict__.setdefault("_kernel_funcs", {})[path] = function
                    name = function.kernel_layer_name
                    functions[path] = (function, f"{op}.{layer.name}")
                mapping[name] = {"cuda": repository}
    for fusion in (f for f in (decoder, attention) if f.OP in ops):  # kgen's subclasses of the model's
        fused |= fusion.fuse(model, lambda op=fusion.OP: getattr(load(build_op(op, arch, root, step)), op))
    if not mapping and not fused and not (losses and not ops):
        known = {p.rsplit(".", 1)[1] for op in ops for layer in load_spec(op).layers for p in layer.replaces}
        for module in (decoder, attention):
            known |= {p.rsplit(".", 1)[1] for p in module.CLASSES} if module.OP in ops else set()
        raise KgenError(
            f"{type(model).__name__}: no module is one that kgen's {', '.join(ops)} layers replace "
            f"({', '.join(sorted(known))})"
        )
    if mapping:
        with use_kernel_mapping(mapping, inherit_mapping=False):
            kernels_kernelize(model, mode=mode or Mode.INFERENCE, device="cuda", use_fallback=True)
    served = {
        name: layers[type(m)] for name, m in model.named_modules() if type(m) in layers and _replaced(m)
    }
    return (
        served
        | {path: layer for path, (function, layer) in functions.items() if _replaced(function)}
        | fused
        | losses
        | (serve_causal_mask(model) if causal_mask else {})
        | serve_grouped_decode(model, grouped_decode)
    )


def causal_lm_loss(cross_entropy):
    """transformers' ForCausalLMLoss (labels shifted so token t predicts t + 1, -100 ignored, the mean over
    the labelled tokens or the sum over ``num_items_in_batch``) with each token's loss from kgen's
    ``cross_entropy`` on the logits as they are: no float32 copy of them, a gradient written once in their
    dtype. Under torch.compile, transformers' own: Inductor fuses it with the (zero) gradient of the logits
    the model returns, one more pass over them beside kgen's op (Qwen3 step, H200: +0.85 ms; BENCHMARKS)."""
    import torch
    import torch.nn.functional as F
    from transformers.loss.loss_utils import ForCausalLMLoss

    def loss_function(
        logits,
        labels,
        vocab_size: int,
        num_items_in_batch=None,
        ignore_index: int = -100,
        shift_labels=None,
        **kwargs,
    ):
        if torch.compiler.is_compiling():
            return ForCausalLMLoss(
                logits, labels, vocab_size, num_items_in_batch, ignore_index, shift_labels, **kwargs
            )
        if shift_labels is None:
            shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
        shift_labels = shift_labels.reshape(-1).to(logits.device)
        total = cross_entropy(logits.reshape(-1, vocab_size), shift_labels, ignore_index).sum()
        if num_items_in_batch is None:
            return total / (shift_labels != ignore_index).sum()
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(total.device)
        return total / num_items_in_batch

    return loss_function


def _replaced_by(path: str, classes: dict, files: set):
    """The model's class at ``path``, or the function (or kernels' module for it) at ``path`` in a file the
    model's classes come from; None otherwise."""
    if path in classes:
        return classes[path]
    where, attr = path.rsplit(".", 1)
    found = getattr(sys.modules[where], attr, None) if where in files else None
    return found if callable(found) and not inspect.isclass(found) else None


def _replaced(module) -> bool:
    return getattr(module.forward, "__func__", None) is not type(module).forward
