"""The rotary family's norm: an RMS-style norm of each rotated tensor before its rotation, in the same pass
(a model's q/k RMSNorm before its RoPE). The DSL node (`RotaryNorm`, a field of `Rotary`), its checks, its
printed code for the kernel template and its CPU evaluation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import sympy as sp
from pydantic import Field

from ..autodiff import derivative
from ..codegen import evaluate, statements
from ..dsl import Identifier, OpSpec, SympyExpr, Tensor, _Model, check_symbols

# the norm's symbols: the element it normalizes, that element's weight, the statistic, the fp32 sum of the
# summand over a head or token, and 1 / the count of elements summed (in fp32); in its backward the gradient
# reaching the normed element, and the gradient reaching the statistic's sum (its slope times the backward
# sum)
x, weight, rstd, row_sum, inv_count = sp.symbols("x weight rstd row_sum inv_count")
grad_normed, grad_row_sum = sp.symbols("grad_normed grad_row_sum")
WEIGHT_DIMS = {"head": "hidden", "token": "heads hidden"}  # a norm weight's dims, by what it normalizes


@dataclass(frozen=True)
class NormCode:
    """A rotary norm as the templates print it."""

    over: str
    max_lanes: int  # the lanes that may sum a head or token (see RotaryNorm.max_lanes)
    lanes_doc: str  # ... which they are, in words
    weights: list[Tensor]
    summand: list[str]  # sets sq from x
    finalize: list[str]  # sets stat from row_sum and inv_count
    normed: list[str]  # sets result from x, rstd and weight
    gradient: NormGradientCode | None = None  # a backward through the norm


@dataclass(frozen=True)
class NormGradientCode:
    """The norm's backward as the templates print it, per element."""

    back_summand: list[str]  # sets partial from x, weight, rstd and grad_normed
    slope: list[str]  # sets slope (dfinalize / drow_sum) from row_sum and inv_count
    gradient: list[str]  # sets result (the input's gradient) from x, weight, rstd, grad_normed, grad_row_sum
    weight_gradient: list[str]  # sets result (this element's share of its weight's gradient), as gradient
    back_needs_rstd: bool  # else the backward sum is taken beside the statistic's, in one pass


class RotaryNorm(_Model):
    """A norm of each rotated tensor before its rotation, in the same pass (a model's q/k RMSNorm before
    its RoPE): over each head ("head": Flux's and Qwen3's norm_q / norm_k over head_dim) or over all heads
    of a token together ("token": Wan's norm_q / norm_k across heads). ``rstd = finalize``, of ``row_sum``
    (the fp32 sum of ``summand`` over the elements normalized together), ``inv_count`` (1 / their count,
    in fp32) and the params; each element ``x`` then becomes ``normed`` (of x, rstd and ``weight``, its
    element of the tensor's weight), the value the conventions' rotated symbols (q, q_pair, ...) hold.
    ``weights`` names one required input per rotated tensor, in order, in the I/O dtype: dims 'hidden'
    ([D]) over a head, 'heads hidden' ([H·D], the heads' channels in order, or [H, D]) over a token. The
    sum runs across the lanes that share a head or token: D / (elements per 16-byte access, twice that for
    rotate_half pairs) lanes, a power of two, with warp shuffles up to 32 (a token's; D = 8 to 256 in 16-bit
    dtypes), and a head's across whole warps of one block too, up to the block's threads (LTX-Video's
    C = 2048 as one head: 256 lanes); the binding refuses others."""

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

    def max_lanes(self, block_threads: int) -> int:
        """The most lanes that sum a head or token: a warp's (a token's heads: one thread walks them), or a
        head's whole warps, up to the largest power of two dividing the block's threads."""
        return 32 if self.over == "token" else max(32, block_threads & -block_threads)

    def lanes_doc(self, block_threads: int) -> str:
        if self.over == "token":
            return "of one warp"
        return f"of one warp or whole warps of a {block_threads}-thread block"

    def refuses(self, shape: tuple[int, ...], elems: int, dtype: str, block_threads: int) -> str | None:
        """The binding's head sizes: D / ``elems`` (an access's elements, twice that for rotate_half pairs)
        lanes, a power of two up to max_lanes."""
        hidden, most = shape[-1], self.max_lanes(block_threads)
        if hidden % elems == 0 and 1 <= (lanes := hidden // elems) <= most and lanes & (lanes - 1) == 0:
            return None
        return (
            f"the norm before the rotation serves head sizes D = {elems} · 2^k up to {most * elems} in "
            f"{dtype} (D / {elems} lanes {self.lanes_doc(block_threads)} sum a {self.over}), "
            f"got D = {hidden} (shape {list(shape)})"
        )

    def gradients(self) -> dict[str, sp.Expr]:
        """The norm's backward per element, derived by sympy (its roundings differentiate as the identity):
        from grad_normed, the gradient reaching an element's normed value, the summand of the backward
        sum over the head or token (grad_normed · ∂normed/∂rstd), the statistic's slope ∂finalize/∂row_sum,
        the input's gradient (grad_row_sum: the slope times the backward sum) and the element's share of
        its weight's gradient (the kernel sums it over the rows)."""
        return {
            "back_summand": grad_normed * derivative(self.normed, "rstd"),
            "slope": derivative(self.finalize, "row_sum"),
            "gradient": grad_normed * derivative(self.normed, "x")
            + grad_row_sum * derivative(self.summand, "x"),
            "weight_gradient": grad_normed * derivative(self.normed, "weight"),
        }

    def notes(self, backward: bool, partial_threads: int) -> dict[str, str]:
        """The plan's notes on the norm and a ``backward``'s weight gradients (≤ ``partial_threads``)."""
        lanes = "head" if self.over == "head" else "token (every head of it: one thread walks them all)"
        notes = {
            "norm": f"each {lanes} normalized before its rotation, in the same pass: a thread sums its "
            f"elements, then the lanes sharing the {self.over} (consecutive lanes of one warp) add theirs by "
            "warp shuffles"
            + (
                " (a head wider than a warp: its warps' sums in shared memory, added by shuffles between two "
                "barriers of the head's threads); "
                if self.over == "head"
                else "; "
            )
            + (
                "the thread's weights are read per head (L1 hits; see heads in flight)"
                if self.over == "head"
                else "the token's heads are read twice (the sum, then the rotation: the second read from "
                "L1/L2)"
            )
            + "; the scalar path keeps the vector path's elements per thread, so that the lanes of a "
            f"{self.over} are the same"
        }
        if backward and self.over == "token":  # the grid and heads in flight above are the forward's
            notes["norm"] = "each token's statistic and backward sum: see weight gradients"
        if backward and self.over == "head":
            notes["weight gradients"] = (
                "each thread adds its channels' shares of one weight over the heads and tokens it walks "
                "(fp32 registers: it keeps one chunk of one tensor's heads); a block adds its threads' in "
                "thread order into one fp32 partial row per weight, and a second kernel adds the rows in "
                "block order, rounding once: deterministic, no atomics; at most one full wave of partial "
                f"rows, or {partial_threads} threads (the profile's planner.column_reduce."
                "resident_threads_per_sm per SM, half a wave) where a wave's would pass 4 MB (weights across "
                "every head)"
            )
        elif backward:
            notes["weight gradients"] = (
                "a weight has a channel per head: where a token's heads fit a block, its threads each hold a "
                "chunk of them (x and the incoming gradient, as loaded; 40 elements of each), the token read "
                "once, its sums across its threads (shuffles, then its warps in order), each thread keeping "
                "its channel group and chunk and its fp32 weight shares in shared memory while its block "
                "walks tokens; otherwise a first kernel per token writes each token's statistics (8 B per "
                "weight) and the inputs' gradients, and a second, with threads keeping one channel group of "
                "a chunk of 4 heads, adds the shares. Either way a block's shares go in a fixed order into "
                f"one fp32 partial row of every head's channels, at most {partial_threads} threads (the "
                "profile's planner.column_reduce.resident_threads_per_sm per SM), and a last kernel adds the "
                "rows in block order, rounding once: deterministic, no atomics"
            )
        return notes

    def code(
        self, names: dict[str, str], inputs: dict[str, Tensor], block_threads: int, backward: bool = False
    ) -> NormCode:
        """The expressions printed for the kernel template (the norm's symbols are its functions'
        arguments), with its backward's where ``backward``; the lanes a ``block_threads`` block serves."""
        symbols = ("x", "weight", "rstd", "row_sum", "inv_count", "grad_normed", "grad_row_sum")
        local = names | {s: s for s in symbols}
        gradient = None
        if backward:
            g = self.gradients()
            gradient = NormGradientCode(
                statements({"partial": g["back_summand"]}, local),
                statements({"slope": g["slope"]}, local),
                statements({"result": g["gradient"]}, local),
                statements({"result": g["weight_gradient"]}, local),
                g["back_summand"].has(rstd),
            )
        return NormCode(
            self.over,
            self.max_lanes(block_threads),
            self.lanes_doc(block_threads),
            [inputs[n] for n in self.weights],
            statements({"sq": self.summand}, local),
            statements({"stat": self.finalize}, local),
            statements({"result": self.normed}, local),
            gradient,
        )

    def normalize(self, v, w, values: dict, io):
        """The norm's output for a rotated tensor v ([B, H, S, D], or [B, S, C] as one head) with its weight
        w, in float64 but for the fp32 1 / count and the expressions' own roundings."""
        bound, _ = self._bound(v, w, values, io)
        return evaluate(self.normed, bound, io).expand(v.shape)

    def backward(self, v, w, dn, values: dict, io):
        """The gradients of v and of its weight w (summed over every head and token, shaped like w) from dn,
        the gradient reaching the norm's output, by the derived expressions (see `gradients`)."""
        bound, dims = self._bound(v, w, values, io)
        bound["grad_normed"] = dn.double()
        g = self.gradients()
        back_sum = evaluate(g["back_summand"], bound, io).expand(v.shape).sum(dims, keepdim=True)
        bound["grad_row_sum"] = evaluate(g["slope"], bound, io) * back_sum
        dx = evaluate(g["gradient"], bound, io).expand(v.shape)
        dw = evaluate(g["weight_gradient"], bound, io).expand(v.shape)
        shaped = bound["weight"]  # [D], or [H, 1, D] over a token: the dims it is broadcast over are summed
        pad = v.dim() - shaped.dim()
        summed = [d for d in range(v.dim()) if d < pad or shaped.shape[d - pad] == 1]
        return dx, dw.sum(summed).reshape(w.shape)

    def _bound(self, v, w, values: dict, io) -> tuple[dict, tuple]:
        """The norm's symbols bound for v and its weight (shaped to broadcast over v), and the dims it
        sums."""
        import torch

        dims = (-1,) if self.over == "head" or v.dim() < 4 else (1, -1)
        count = v.shape[-1] * (v.shape[1] if len(dims) == 2 else 1)
        row_sum = evaluate(self.summand, values | {"x": v}, io).expand(v.shape).sum(dims, keepdim=True)
        inv_count = float(torch.tensor(1 / count, dtype=torch.float32))
        stat = evaluate(self.finalize, values | {"row_sum": row_sum, "inv_count": inv_count}, io)
        if self.over == "token" and v.dim() == 4:  # [H·D] or [H, D]: head h's channels
            w = w.reshape(v.shape[1], 1, v.shape[-1])
        bound = values | {
            "x": v,
            "rstd": stat,
            "weight": w.double(),
            "row_sum": row_sum,
            "inv_count": inv_count,
        }
        return bound, dims
