"""The rotary family's norm: an RMS-style norm of each rotated tensor before its rotation, in the same pass
(a model's q/k RMSNorm before its RoPE). The DSL node (`RotaryNorm`, a field of `Rotary`), its checks, its
printed code for the kernel template and its CPU evaluation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import sympy as sp
from pydantic import Field

from ..codegen import evaluate, statements
from ..dsl import Identifier, OpSpec, SympyExpr, Tensor, _Model, check_symbols

# the norm's symbols: the element it normalizes, that element's weight, the statistic, the fp32 sum of the
# summand over a head or token, and 1 / the count of elements summed (in fp32)
x, weight, rstd, row_sum, inv_count = sp.symbols("x weight rstd row_sum inv_count")
WEIGHT_DIMS = {"head": "hidden", "token": "heads hidden"}  # a norm weight's dims, by what it normalizes


@dataclass(frozen=True)
class NormCode:
    """A rotary norm as the templates print it."""

    over: str
    weights: list[Tensor]
    summand: list[str]  # sets sq from x
    finalize: list[str]  # sets stat from row_sum and inv_count
    normed: list[str]  # sets result from x, rstd and weight


class RotaryNorm(_Model):
    """A norm of each rotated tensor before its rotation, in the same pass (a model's q/k RMSNorm before
    its RoPE): over each head ("head": Flux's and Qwen3's norm_q / norm_k over head_dim) or over all heads
    of a token together ("token": Wan's norm_q / norm_k across heads). ``rstd = finalize``, of ``row_sum``
    (the fp32 sum of ``summand`` over the elements normalized together), ``inv_count`` (1 / their count,
    in fp32) and the params; each element ``x`` then becomes ``normed`` (of x, rstd and ``weight``, its
    element of the tensor's weight), the value the conventions' rotated symbols (q, q_pair, ...) hold.
    ``weights`` names one required input per rotated tensor, in order, in the I/O dtype: dims 'hidden'
    ([D]) over a head, 'heads hidden' ([H·D], the heads' channels in order, or [H, D]) over a token. The
    sum runs across the lanes that share a head or token, with warp shuffles: the kernels serve head sizes
    D whose D / (elements per 16-byte access, twice that for rotate_half pairs) is a power of two up to 32
    (D = 8 to 256 in 16-bit dtypes), and the binding refuses others."""

    over: Literal["head", "token"]
    weights: list[Identifier] = Field(min_length=1, max_length=2)
    summand: SympyExpr
    finalize: SympyExpr
    normed: SympyExpr

    def check(self, spec: OpSpec, rotates: list[str]) -> None:
        by_name = {t.name: t for t in spec.inputs}
        dims = WEIGHT_DIMS[self.over]
        weights = [by_name.get(n) for n in self.weights]
        if len(weights) != len(rotates) or any(
            t is None or t.dims != dims or t.dtype != "io" or t.optional or t.broadcast for t in weights
        ):
            raise ValueError(
                f"structure.norm.weights: {self.weights} must name one required input per rotated tensor "
                f"({rotates}), in the I/O dtype, with dims {dims!r} (a norm over a {self.over})"
            )
        floats = {p.name for p in spec.params if not p.integer}
        check_symbols(self.summand, {"x"} | floats, "structure.norm.summand", False)
        check_symbols(self.finalize, {"row_sum", "inv_count"} | floats, "structure.norm.finalize", False)
        check_symbols(self.normed, {"x", "weight", "rstd"} | floats, "structure.norm.normed")

    def code(self, names: dict[str, str], inputs: dict[str, Tensor]) -> NormCode:
        """The expressions printed for the kernel template (the norm's symbols are its functions'
        arguments)."""
        local = names | {s: s for s in ("x", "weight", "rstd", "row_sum", "inv_count")}
        return NormCode(
            self.over,
            [inputs[n] for n in self.weights],
            statements({"sq": self.summand}, local),
            statements({"stat": self.finalize}, local),
            statements({"result": self.normed}, local),
        )

    def normalize(self, v, w, values: dict, io):
        """The norm's output for a rotated tensor v ([B, H, S, D], or [B, S, C] as one head) with its weight
        w, in float64 but for the fp32 1 / count and the expressions' own roundings."""
        import torch

        dims = (-1,) if self.over == "head" or v.dim() < 4 else (1, -1)
        count = v.shape[-1] * (v.shape[1] if len(dims) == 2 else 1)
        row_sum = evaluate(self.summand, values | {"x": v}, io).expand(v.shape).sum(dims, keepdim=True)
        inv_count = float(torch.tensor(1 / count, dtype=torch.float32))
        stat = evaluate(self.finalize, values | {"row_sum": row_sum, "inv_count": inv_count}, io)
        if self.over == "token" and v.dim() == 4:  # [H·D] or [H, D]: head h's channels
            w = w.reshape(v.shape[1], 1, v.shape[-1])
        return evaluate(self.normed, values | {"x": v, "rstd": stat, "weight": w.double()}, io).expand(
            v.shape
        )
