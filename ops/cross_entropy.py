"""Cross-entropy of each row's scores against its class label: loss = logsumexp(logits) - logits[label], in
fp32, 0 where the label is ignore_index. The per-row loss of transformers' ForCausalLMLoss (which first copies
the logits to float32, then calls F.cross_entropy) without the float32 copy: the bf16 logits are read as they
are.

Order: reference, the implementations it replaces, then the spec.
"""

import sympy as sp
import torch
import torch.nn.functional as F

from kgen.dsl import Convention, OpSpec, Param, Tensor
from kgen.families.softmax_loss import SoftmaxLoss, lse, picked

logits = sp.Symbol("logits")


def cross_entropy_ref(logits: torch.Tensor, label: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """float64 reference: each row's loss, 0 where the label is ignore_index. The log-softmax with the row's
    max taken out, as F.cross_entropy computes it: a +inf score gives NaN (inf - inf), not inf."""
    x = logits.double()
    kept = label != ignore_index
    index = torch.where(kept, label, torch.zeros_like(label)).unsqueeze(-1)
    loss = -torch.log_softmax(x, dim=-1).gather(-1, index).squeeze(-1)
    return torch.where(kept, loss, torch.zeros_like(loss))


def transformers_cross_entropy(logits: torch.Tensor, label: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """transformers' ForCausalLMLoss as it computes each row's loss: the logits copied to float32, then
    F.cross_entropy."""
    flat = logits.float().view(-1, logits.shape[-1])
    return F.cross_entropy(flat, label.reshape(-1), ignore_index=ignore_index, reduction="none").view(
        label.shape
    )


def liger_cross_entropy(logits: torch.Tensor, label: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """Liger-Kernel's Triton cross-entropy (per-row losses)."""
    from liger_kernel.transformers.functional import liger_cross_entropy as liger  # lazily: optional

    flat = logits.view(-1, logits.shape[-1])
    return liger(flat, label.reshape(-1), ignore_index=ignore_index, reduction="none").view(label.shape)


spec = OpSpec(
    name="cross_entropy",
    summary="cross-entropy of each row's scores against its class label, fp32 loss per row",
    tensors=[
        Tensor(name="logits", dims="*rows hidden", doc="one row of class scores (a vocabulary) per token"),
        Tensor(name="label", dims="*rows", dtype="int64", doc="each row's class; ignore_index for none"),
        Tensor(name="loss", dims="*rows", role="output", dtype="float32", doc="each row's loss"),
    ],
    params=[
        Param(name="ignore_index", default=-100, integer=True, doc="the label of rows without one"),
    ],
    structure=SoftmaxLoss(
        logit=logits,
        conventions=[
            Convention(
                name="single_rounding",
                outputs={"loss": lse - picked},
                matches="torch.nn.functional.cross_entropy on float32 logits (transformers ForCausalLMLoss)",
            ),
        ],
    ),
    reference=cross_entropy_ref,
    peers={
        "eager (transformers)": transformers_cross_entropy,
        "Liger (liger_cross_entropy)": liger_cross_entropy,
    },
)
