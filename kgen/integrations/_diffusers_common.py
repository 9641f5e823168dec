"""What the diffusers patches share (kgen.integrations.diffusers, flux, wan): the refusal of a model that
hooks already wrap, the residual add a patched block leaves to the next norm, the forwards of
torch.nn.RMSNorm and of GELU(approximate="tanh") on kgen's ops, and when an attention's q/k norms and its
rotation run as one kernel."""

from __future__ import annotations

from typing import Any, NamedTuple

from ..errors import KgenError
from ._rotary_fit import lanes_fit


class Pending(NamedTuple):
    """A block's output whose last residual add (hidden + ff · gate) the next norm does, in the same pass."""

    hidden: Any
    ff: Any
    gate: Any


def unpacked(x) -> tuple:
    """A block's input as plain tensors, what a checkpoint function saves: a `Pending` add's three, or
    (x, None, None)."""
    return tuple(x) if isinstance(x, Pending) else (x, None, None)


def packed(hidden, ff, gate):
    """`unpacked`'s inverse: the tensor, or the `Pending` add."""
    return hidden if ff is None else Pending(hidden, ff, gate)


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


def gelu_forward(kernel):
    """diffusers' GELU(approximate="tanh"): its projection, then the activation."""

    def forward(self, hidden_states):
        return kernel.gelu_tanh(self.proj(hidden_states))

    return forward


def fuses_qk_norms(q, norm_q, norm_k, over: str = "head") -> bool:
    """Whether an attention's q/k norms (torch.nn.RMSNorm) and the rotation after them run as one
    qk_norm_rope_* launch (in training too: each has a derived backward): one eps, both weights present in
    q's dtype, and a head size D = q's last dim the kernel serves (interleaved pairs, a norm ``over`` each
    head or each token's heads: _rotary_fit)."""
    weights = norm_q.weight, norm_k.weight
    if (
        any(w is None or w.dtype != q.dtype for w in weights)
        or norm_q.eps != norm_k.eps
        or norm_q.eps is None
    ):
        return False
    return lanes_fit(q.shape[-1], q.element_size(), half_pairs=False, over=over)
