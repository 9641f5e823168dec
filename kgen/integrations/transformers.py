"""Serves a transformers model's layers with kgen kernels through `kernels.kernelize`.

transformers marks its layers for `kernels` (Qwen3RMSNorm is `@use_kernel_forward_from_hub("RMSNorm")`) only with
the kernels versions it supports (0.16.x for transformers 5.17, where kgen needs 0.17). So kgen marks the classes
its specs' layers replace itself, with kernels' `replace_kernel_forward_from_hub` (keeping a name transformers
already gave), builds the projects and kernelizes with a mapping to them. No transformers code is copied.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..builder import device_arch
from ..catalog import KgenError, load_spec
from . import built

OPS = ("rmsnorm", "silu_mul")  # RMSNorm everywhere (q_norm and k_norm too) and the SwiGLU MLP


def kernelize(model, ops: tuple[str, ...] = OPS, *, arch: str | None = None, root: Path = Path("generated"),
              mode=None, step: Callable[[str], None] = lambda _: None) -> dict[str, str]:
    """Replaces the forward of every module of ``model`` that a layer of ``ops`` replaces (and whose condition
    holds) with that layer's, from ``root/<op>-<arch>`` (written and built when missing or stale). Returns
    {module name: "<op>.<layer>"} for the modules now served; refuses a model none of whose modules is known."""
    from kernels import LocalLayerRepository, Mode, replace_kernel_forward_from_hub, use_kernel_mapping
    from kernels import kernelize as kernels_kernelize

    arch = arch or device_arch()
    classes = {f"{type(m).__module__}.{type(m).__qualname__}": type(m) for m in model.modules()}
    mapping, layers = {}, {}
    for op in ops:
        for layer in load_spec(op).layers:
            found = [classes[path] for path in layer.replaces if path in classes]
            if not found:
                continue
            project = built(op, arch, root, step)
            for cls in found:
                name = getattr(cls, "kernel_layer_name", None) or layer.name
                replace_kernel_forward_from_hub(cls, name, layer.condition)
                mapping[name] = {"cuda": LocalLayerRepository(repo_path=project, layer_name=layer.name)}
                layers[cls] = f"{op}.{layer.name}"
    if not mapping:
        known = sorted({p.rsplit(".", 1)[1] for op in ops for layer in load_spec(op).layers for p in layer.replaces})
        raise KgenError(f"{type(model).__name__}: no module is one that kgen's {', '.join(ops)} layers replace "
                        f"({', '.join(known)})")
    with use_kernel_mapping(mapping, inherit_mapping=False):
        kernels_kernelize(model, mode=mode or Mode.INFERENCE, device="cuda", use_fallback=True)
    return {name: layers[type(m)] for name, m in model.named_modules()
            if type(m) in layers and getattr(m.forward, "__func__", None) is not type(m).forward}
