"""What the diffusers patches share (kgen.integrations.diffusers, flux, wan): the refusal of a model that
hooks already wrap, the residual add a patched block leaves to the next norm, and the forwards of
torch.nn.RMSNorm and of GELU(approximate="tanh") on kgen's ops."""

from __future__ import annotations

from typing import Any, NamedTuple

from ..errors import KgenError


class Pending(NamedTuple):
    """A block's output whose last residual add (hidden + ff · gate) the next norm does, in the same pass."""

    hidden: Any
    ff: Any
    gate: Any


def refuse_hooks(model, name: str) -> None:
    """Refuses ``model`` (named ``name`` in the message) when accelerate's or diffusers' hooks wrap any of its
    modules: they hold the forwards a patch would replace."""
    if any(hasattr(m, "_hf_hook") or hasattr(m, "_diffusers_hook") for m in model.modules()):
        raise KgenError(
            f"{name}: patch it before enable_model_cpu_offload (or any accelerate or diffusers hook: "
            "offloading, caching), whose hooks wrap the forwards the patch replaces"
        )


def rms_forward(rmsnorm):
    def forward(self, x):
        """torch.nn.RMSNorm's numerics (one rounding); its eps of None is the dtype's epsilon, as torch's."""
        import torch

        return rmsnorm(x, self.weight, self.eps if self.eps is not None else torch.finfo(x.dtype).eps)

    return forward


def gelu_forward(kernel, project: bool):
    """GELU(approximate="tanh"): diffusers' (a projection, then the activation) or torch's."""

    def forward(self, hidden_states):
        return kernel.gelu_tanh(self.proj(hidden_states) if project else hidden_states)

    return forward
