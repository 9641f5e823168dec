"""The rotary family's grid angles: rotary angles computed in the kernel from each token's place on a latent
grid or from given positions (LTX-Video's, Flux's and Wan's RoPE), instead of read from cos/sin tables. The
DSL node (`GridAngles`, a field of `Rotary`), its checks, its printed code for the kernel template and its
CPU evaluation (the tables the kernel computes)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import sympy as sp
from pydantic import Field

from ..codegen import evaluate, statements
from ..dsl import Identifier, OpSpec, SympyExpr, _Model, check_symbols
from .base import Case

# k (a frequency's index), n_freq (how many), coord (an axis coordinate), freq
k, n_freq, coord, freq = sp.symbols("k n_freq coord freq")
COORDINATES = "batch axes tokens"  # a float32 [B, axes, S] tensor: each token's grid coordinates


@dataclass(frozen=True)
class GridCode:
    axes: list[str]
    sizes: list[str]
    coordinates_input: str | None
    coordinates: list[list[str]]
    frequency: list[str]
    angle: list[str]
    layout: str
    axis_dims: list[str]
    real: str  # the C type of the angle math: float or double


class GridAngles(_Model):
    """Rotary angles computed in the kernel from each token's place on a latent grid (LTX-Video's 3D RoPE), or
    from given positions (Flux's ids). Tokens run row-major over the integer params ``sizes``; ``axes`` name
    the index along each. Channels go to axes by ``layout``: "interleaved" (LTX-Video): the first C mod
    (2·axes) channels pass through (cos 1, sin 0); channel c >= that pad is in pair j = (c - pad) // 2, with
    frequency k = j // len(axes) of n_freq = C // (2·axes) and axis j mod len(axes). "blocks" (Flux, Wan):
    axis a holds ``axis_dims[a]`` consecutive channels (integer params summing to C, each even), its pair j
    having frequency k = j of n_freq = axis_dims[a] / 2. ``coordinates`` (one per axis, of its index and
    params), ``frequency`` (of k and n_freq) and ``angle`` (of freq and coord) are computed in ``precision``;
    cos and sin of the angle are then rounded to fp32 (the tables a library builds in float64)."""

    axes: list[Identifier] = Field(min_length=1, max_length=3)
    sizes: list[Identifier] = Field(default=[], max_length=3)
    coordinates: list[SympyExpr]
    # a 'batch axes tokens' input giving each token's coordinates (diffusers' video_coords) instead of the
    # sizes; then ``coordinates`` map each given value (the axis symbol) to the coordinate
    coordinates_input: Identifier | None = None
    frequency: SympyExpr
    angle: SympyExpr
    layout: Literal["interleaved", "blocks"] = "interleaved"
    axis_dims: list[Identifier] = Field(default=[], max_length=3)
    precision: Literal["float32", "float64"] = "float32"

    def check(self, spec: OpSpec) -> None:
        """The params each field names exist with the right kind; each expression uses only its symbols."""
        ints = {p.name for p in spec.params if p.integer}
        sizes = len(self.axes) if self.coordinates_input is None else 0
        if not set(self.sizes) <= ints or not (
            len(self.sizes) == sizes and len(self.axes) == len(self.coordinates)
        ):
            raise ValueError(
                f"structure.grid: one coordinate per axis, and one size per axis (an integer param; "
                f"have {sorted(ints)}) unless the coordinates come from coordinates_input"
            )
        blocks = self.layout == "blocks"
        if not set(self.axis_dims) <= ints or len(self.axis_dims) != (len(self.axes) if blocks else 0):
            raise ValueError(
                "structure.self.axis_dims: with layout 'blocks', one integer param per axis giving its "
                f"channels (have {sorted(ints)}); none with layout 'interleaved'"
            )
        floats = {p.name for p in spec.params if not p.integer}
        for axis, expr in zip(self.axes, self.coordinates):
            check_symbols(expr, {axis} | floats, f"structure.self.coordinates.{axis}", False)
        check_symbols(self.frequency, {"k", "n_freq"} | floats, "structure.self.frequency", False)
        check_symbols(self.angle, {"freq", "coord"} | floats, "structure.self.angle", False)

    def code(self, names: dict[str, str]) -> GridCode:
        """The grid's expressions printed for the kernel template, in its precision."""
        double = self.precision == "float64"
        return GridCode(
            self.axes,
            self.sizes,
            self.coordinates_input,
            [statements({"coord": e}, names, double) for e in self.coordinates],
            statements({"freq": self.frequency}, names, double),
            statements({"angle": self.angle}, names, double),
            self.layout,
            self.axis_dims,
            "double" if double else "float",
        )

    def refuses(self, lead: str, shape: tuple[int, ...], params: dict | None = None) -> str | None:
        """The binding's check of the lead's dims: [B, S, C], with layout "blocks" also [B, H, S, D]; where
        ``params`` name the sizes, their product against the tokens. (Its check of the axes' channels against
        C is left to the binding.)"""
        blocks = self.layout == "blocks"
        if len(shape) == 3 or (blocks and len(shape) == 4):
            sizes = [int(params[n]) for n in self.sizes if n in (params or {})]
            if self.sizes and len(sizes) == len(self.sizes) and math.prod(sizes) != shape[-2]:
                return (
                    f"{lead} has {shape[-2]} tokens per batch but {'·'.join(self.sizes)} = "
                    f"{'·'.join(map(str, sizes))}"
                )
            return None
        tokens = f" with S = {'·'.join(self.sizes)} tokens in row-major order" if self.sizes else ""
        return f"{lead} must be [B, S, C]{' or [B, H, S, D]' * blocks}{tokens}, got shape {list(shape)}"

    def tables(self, given: dict, params: dict, lead) -> tuple:
        """cos and sin [B, S, C] (or [B, 1, S, D] beside a 4-D lead) from the grid angles, in the grid's
        precision as the kernel computes them, rounded to fp32."""
        import torch

        f32 = torch.float32
        real = torch.float64 if self.precision == "float64" else f32
        batch, tokens, hidden = lead.shape[0], lead.shape[-2], lead.shape[-1]
        naxes = len(self.axes)
        floats = {k: v for k, v in params.items() if k in ("hidden", "inv_hidden") or not isinstance(v, int)}
        if self.coordinates_input:
            raw = given[self.coordinates_input].to(f32).to(real)  # [B, axes, S]
        else:
            sizes = [int(params[n]) for n in self.sizes]
            index = torch.arange(tokens)
            raw = torch.stack(
                [index // (torch.tensor(sizes[a + 1 :]).prod()) % sizes[a] for a in range(naxes)]
            )
            raw = raw.to(real).unsqueeze(0).expand(batch, -1, -1)
        coords = torch.stack(
            [
                torch.as_tensor(evaluate(e, floats | {axis: raw[:, a]}, None))
                .to(real)
                .expand(raw[:, a].shape)
                for a, (axis, e) in enumerate(zip(self.axes, self.coordinates))
            ],
            1,
        )  # [B, axes, S]
        if self.layout == "blocks":  # each pair's axis, frequency index and frequency count
            dims = [int(params[n]) for n in self.axis_dims]
            axis = torch.tensor([a for a, d in enumerate(dims) for _ in range(d // 2)])
            k = torch.cat([torch.arange(d // 2) for d in dims])
            n_freq = torch.tensor([d // 2 for d in dims for _ in range(d // 2)])
            pad = 0
        else:
            pad, count = hidden % (2 * naxes), hidden // (2 * naxes)
            pairs = torch.arange((hidden - pad) // 2)
            axis, k, n_freq = pairs % naxes, pairs // naxes, torch.full_like(pairs, count)
        freq = evaluate(self.frequency, floats | {"k": k.to(real), "n_freq": n_freq.to(real)}, None)
        freq = torch.as_tensor(freq).to(real).repeat_interleave(2)  # per channel
        coord = coords[:, axis.repeat_interleave(2), :].transpose(1, 2)  # [B, S, C - pad]
        angle = evaluate(self.angle, floats | {"freq": freq, "coord": coord}, None)
        angle = torch.as_tensor(angle).to(real).expand(batch, tokens, hidden - pad)
        cos = torch.cat([torch.ones(batch, tokens, pad, dtype=f32), angle.cos().to(f32)], -1)
        sin = torch.cat([torch.zeros(batch, tokens, pad, dtype=f32), angle.sin().to(f32)], -1)
        if lead.dim() == 4:
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return cos.double(), sin.double()

    def example_cases(self) -> list[Case]:
        """A grid of 2·3·4 tokens at a few widths; with layout "blocks", per-head widths split among the axes
        (an empty axis included), as [B, S, C] and [B, H, S, D]."""
        sizes = tuple(zip(self.sizes, (2, 3, 4)))
        if self.layout == "blocks":
            splits = [(2, 0, 0), (4, 4, 4), (16, 56, 56), (44, 42, 42), (6, 0, 10)]
            return [
                Case(
                    (1, 3, 24, sum(d)) if i % 2 else (1, 24, sum(d)),
                    params=sizes + tuple(zip(self.axis_dims, d)),
                )
                for i, d in enumerate(splits)
            ]
        return [Case((1, 24, c), params=sizes) for c in (2, 12, 64, 100, 2048, 4096)]
