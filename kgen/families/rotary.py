"""The rotary family: pairwise rotation of q (and k) by angles read from cos/sin tables or computed in the
kernel from each token's place on a latent grid (text-model RoPE, LTX-Video's 3D RoPE).

DSL: `Rotary(pairing, rotates, tables | grid, conventions)`. Plan: a thread keeps one channel group and
walks tokens, rotating every head of a token with cos and sin fetched once; the grid stops at one full
wave; heads in flight per pairing (profile [planner.rotary]). Templates: codegen_templates/rotary/."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import sympy as sp
from pydantic import BaseModel, ConfigDict, Field

from ..autodiff import backward_reference, derivative, gradient_name
from ..codegen import evaluate, statements
from ..dsl import Convention, Identifier, OpSpec, Structure, SympyExpr, Tensor, _Model, check_symbols
from ..profile import ArchProfile, TuningTable
from .base import (
    DTYPE_BYTES,
    Bucket,
    Case,
    Family,
    FamilyContext,
    KernelPlan,
    LaunchPlan,
    Templates,
    convention_code,
    io_rounding,
    min_bytes,
    printed_names,
    scalar_values,
    vector_notes,
)

# an element's pair partner is <name>_pair; sign is -1 on a pair's first element, +1 on its second;
# cos_pair and sin_pair are the partner's table values (equal to cos and sin in every table a model builds,
# but a backward reads them: the partner's output holds this element with the partner's angle)
cos, sin, sign, cos_pair, sin_pair = sp.symbols("cos sin sign cos_pair sin_pair")
# grid angles: k (a frequency's index), n_freq (how many), coord (an axis coordinate), freq
k, n_freq, coord, freq = sp.symbols("k n_freq coord freq")
COORDINATES = "batch axes tokens"  # a float32 [B, axes, S] tensor: each token's grid coordinates


class GridAngles(_Model):
    """Rotary angles computed in the kernel from each token's place on a latent grid (LTX-Video's 3D RoPE).
    Tokens run row-major over the integer params ``sizes``; ``axes`` name the index along each. The first C
    mod (2·axes) channels pass through (cos 1, sin 0); channel c >= that pad is in pair j = (c - pad) // 2,
    with frequency k = j // len(axes) of n_freq = C // (2·axes) and axis j mod len(axes). ``coordinates``
    (one per axis, of its index and params), ``frequency`` (of k and n_freq) and ``angle`` (of freq and
    coord) are fp32 math."""

    axes: list[Identifier] = Field(min_length=1, max_length=3)
    sizes: list[Identifier] = Field(default=[], max_length=3)
    coordinates: list[SympyExpr]
    # a 'batch axes tokens' input giving each token's coordinates (diffusers' video_coords) instead of the
    # sizes; then ``coordinates`` map each given value (the axis symbol) to the coordinate
    coordinates_input: Identifier | None = None
    frequency: SympyExpr
    angle: SympyExpr


class Rotary(Structure):
    """Pairwise rotation of each tensor in ``rotates`` (q, and optionally k: required '*rows hidden' inputs
    in the I/O dtype, the lead first) into the outputs, in order: pairs (2i, 2i + 1) ("interleaved", GPT-J
    / Flux / LTX-Video) or (i, i + D/2) ("half", Llama's rotate_half). cos and sin per element come from
    the two broadcast input tensors named in ``tables`` (cos, sin), or from ``grid``. Each convention gives
    an output its element from the input's element, ``<input>_pair``, cos, sin, sign, and the partner's
    cos_pair and sin_pair."""

    kind: str = "rotary"
    pairing: Literal["interleaved", "half"]
    rotates: list[Identifier] = Field(min_length=1, max_length=2)
    tables: tuple[Identifier, Identifier] | None = None
    grid: GridAngles | None = None

    dims = ("*rows hidden", COORDINATES)
    # the binding's locals and helpers (the kernels reach tensors as args.<name> only), and the rotation's
    # symbols
    declares = frozenset({"batch", "tokens", "as_bhtd", "load_floats", "store_floats", "sign"})

    def check(self, spec: OpSpec) -> set[str]:
        by_name = {t.name: t for t in spec.inputs}
        rotated = [by_name.get(n) for n in self.rotates]
        tables = [by_name.get(n) for n in self.tables or ()]
        given = [t for t in spec.inputs if t.dims == COORDINATES]
        if (
            any(
                t is None or t.dims != "*rows hidden" or t.dtype != "io" or t.optional or t.broadcast
                for t in rotated
            )
            or rotated[0] is not spec.lead
            or {"cos", "sin", "cos_pair", "sin_pair"} & set(self.rotates)
        ):
            raise ValueError(
                f"structure.rotates: {self.rotates} must name required '*rows hidden' inputs in the "
                f"I/O dtype, not broadcast, the lead ({spec.lead.name!r}) first, and not named cos, sin, "
                "cos_pair or sin_pair (the rotation's symbols)"
            )
        if None in tables or set(spec.inputs) - set(rotated) - set(tables) - set(given):
            raise ValueError(
                "a rotary op takes the tensors it rotates, the cos and sin tables it names in "
                "`tables` (or a grid's coordinates input), and nothing else"
            )
        if len(rotated) != len(spec.outputs):
            raise ValueError(
                f"a rotary op has one output per rotated input: inputs {self.rotates}, outputs "
                f"{[t.name for t in spec.outputs]}"
            )
        if {t.name for t in given} != ({self.grid.coordinates_input} - {None} if self.grid else set()):
            raise ValueError(
                f"a {COORDINATES!r} input is the coordinates_input of a rotary op's grid angles, "
                "and that input needs one"
            )
        if any(t.dtype != "float32" or t.optional for t in given):
            raise ValueError("a grid's coordinates input is a required float32 tensor")
        if self.grid is None and (len(tables) != 2 or any(not t.broadcast for t in tables)):
            raise ValueError(
                "a rotary op without grid angles names its cos and sin tensors in `tables`, each "
                "with broadcast=True"
            )
        if any(spec.inplace.get(o.name, r.name) != r.name for o, r in zip(spec.outputs, rotated)):
            raise ValueError("inplace: a rotary op's output may only overwrite its own rotated input")
        if self.grid is not None:
            self._check_grid(spec, tables)
        return (
            set(self.rotates)
            | {f"{n}_pair" for n in self.rotates}
            | {"cos", "sin", "sign", "cos_pair", "sin_pair"}
        )

    def _check_grid(self, spec: OpSpec, tables: list[Tensor]) -> None:
        grid = self.grid
        if tables or self.pairing != "interleaved":
            raise ValueError("grid angles serve interleaved pairs, with no cos/sin tensors")
        ints = {p.name for p in spec.params if p.integer}
        sizes = len(grid.axes) if grid.coordinates_input is None else 0
        if not set(grid.sizes) <= ints or not (
            len(grid.sizes) == sizes and len(grid.axes) == len(grid.coordinates)
        ):
            raise ValueError(
                f"structure.grid: one coordinate per axis, and one size per axis (an integer param; "
                f"have {sorted(ints)}) unless the coordinates come from coordinates_input"
            )
        floats = {p.name for p in spec.params if not p.integer}
        for axis, expr in zip(grid.axes, grid.coordinates):
            check_symbols(expr, {axis} | floats, f"structure.grid.coordinates.{axis}", False)
        check_symbols(grid.frequency, {"k", "n_freq"} | floats, "structure.grid.frequency", False)
        check_symbols(grid.angle, {"freq", "coord"} | floats, "structure.grid.angle", False)


class RotaryFacts(BaseModel):
    """[planner.rotary] of an arch profile."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    heads_in_flight: dict[Literal["interleaved", "half"], int] = Field(min_length=2)


@dataclass(frozen=True)
class RotaryPlan(KernelPlan):
    heads_in_flight: int  # heads a thread loads before it stores the first
    wave_threads: int  # one full wave: the grid stops there, threads walking tokens


@dataclass(frozen=True)
class GridCode:
    axes: list[str]
    sizes: list[str]
    coordinates_input: str | None
    coordinates: list[list[str]]
    frequency: list[str]
    angle: list[str]


@dataclass(frozen=True)
class RotaryContext(FamilyContext):
    pairing: str
    grid: GridCode | None
    rotated: list[str]
    rotated_tensors: list[Tensor]
    tables: list[Tensor]
    table_float32: bool
    heads_expr: list[str]
    heads_in_flight: int


class RotaryFamily(Family):
    name = "rotary"
    structure = Rotary
    facts = RotaryFacts
    templates = Templates(
        kernel="rotary/kernel.cu.j2",
        args="rotary/args.h.j2",
        binding="rotary/binding.cpp.j2",
        fake="rotary/fake.py.j2",
        inputs="rotary/inputs.md.j2",
    )

    def plan(self, spec: OpSpec, profile: ArchProfile, dtype: str, tuning: TuningTable | None) -> RotaryPlan:
        """A thread rotates its channels of one token across the heads, fetching cos and sin once."""
        elem, pairing = DTYPE_BYTES[dtype], spec.structure.pairing
        vector = profile.max_access_bytes // elem
        tuned = tuning.threads(spec.name, dtype, None) if tuning else None
        threads = tuned[0] if tuned else profile.planner.block_threads
        heads = self.check_facts(profile).heads_in_flight[pairing]
        reasons = {
            "threads_per_row": (tuned[1] + " (threads per block)")
            if tuned
            else f"{threads} threads per block (profile planner.block_threads), each one access of a token's "
            "channels in every head (cos and sin fetched once per token), unless that leaves fewer threads "
            "than one full wave: then heads are split in chunks",
            "rows_per_block": "tokens are flattened: a block covers consecutive channel groups",
            "storage": "nothing kept: each element is read once and written once",
        }
        scalar = 2 if pairing == "interleaved" else 1  # interleaved: a pair is adjacent, one access
        buckets = [Bucket(None, n, threads, 1, 1, "global", False, reasons) for n in (vector, scalar)]
        what = "" if pairing == "interleaved" else " (rotate_half pairs: hidden a multiple of twice that)"
        notes = vector_notes(dtype, vector, elem, "every tensor is", what) | {
            "scalar path": f"otherwise {'one pair' if scalar == 2 else 'one element'} per access: correct "
            f"for any "
            "alignment and any hidden size",
            "block_threads": reasons["threads_per_row"],
            "heads in flight": f"{heads} head{'s' if heads > 1 else ''} in flight per thread with "
            f"{'rotate_half' if pairing == 'half' else pairing} pairs, "
            "all loaded before the first is stored (profile planner.rotary.heads_in_flight)",
        }
        return RotaryPlan(
            spec.name,
            profile.name,
            dtype,
            elem,
            vector,
            scalar,
            threads,
            buckets,
            notes,
            heads,
            profile.sm_count * profile.max_threads_per_sm,
        )

    def launch(self, spec: OpSpec, profile: ArchProfile, kernel: RotaryPlan, case: Case) -> LaunchPlan:
        rows, hidden = case.rows, case.shape[-1]
        half = spec.structure.pairing == "half"
        vector = hidden % (kernel.vector_elems * (2 if half else 1)) == 0
        b = kernel.buckets[0 if vector else 1]
        grid = min(
            -(-rows * (hidden // (b.elems_per_access * (2 if half else 1))) // b.block_threads),
            kernel.wave_threads // b.block_threads,
        )
        choices = [
            (
                "accesses",
                f"{b.elems_per_access * kernel.elem_bytes} B ({b.elems_per_access} elements)",
                kernel.notes["vector path" if vector else "scalar path"],
            ),
            ("block", f"{b.block_threads} threads", b.reasons["threads_per_row"]),
            (
                "grid",
                f"{grid} blocks",
                f"ceil({rows} × {hidden} / {b.elems_per_access} accesses / "
                f"{b.block_threads}) on {profile.sm_count} SMs, at most one full wave "
                f"({kernel.wave_threads // b.block_threads}), threads walking tokens",
            ),
            ("storage", "none", b.reasons["storage"]),
            ("heads in flight", str(kernel.heads_in_flight), kernel.notes["heads in flight"]),
        ]
        return LaunchPlan(
            kernel, b, rows, hidden, grid, 0, min_bytes(self, spec, case, kernel.elem_bytes), choices
        )

    def evaluate(self, spec: OpSpec, inputs: list, params: list, convention: str) -> tuple:
        """Each rotated tensor with its pair partner and sign; cos and sin from the tables (broadcast over the
        heads), or computed in fp32 from the grid as the kernel does."""
        import torch

        structure = spec.structure
        conv = structure.convention(convention)
        given = dict(zip((t.name for t in spec.inputs), inputs))
        lead = given[structure.rotates[0]]
        hidden = lead.shape[-1]
        values = scalar_values(spec, params, hidden)
        if structure.tables:
            cos, sin = (given[n].double() for n in structure.tables)
            if lead.dim() == 4 and cos.dim() == 3:  # [B or 1, T, D] beside [B, H, T, D]
                cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        else:
            cos, sin = self._grid_tables(spec, given, values, lead)
        if structure.pairing == "interleaved":
            sign = torch.tensor([-1.0, 1.0], dtype=torch.float64).repeat(hidden // 2)
        else:
            sign = torch.cat([torch.full((hidden // 2,), -1.0), torch.ones(hidden // 2)]).double()

        def pair(v):  # each element's partner
            if structure.pairing == "interleaved":
                return v.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
            return torch.cat([v[..., hidden // 2 :], v[..., : hidden // 2]], -1)

        tables = {"cos": cos, "sin": sin, "sign": sign, "cos_pair": pair(cos), "sin_pair": pair(sin)}
        io, out = io_rounding(lead.dtype), []
        for name, t in zip(structure.rotates, spec.outputs):
            v = given[name].double()
            symbols = values | tables | {name: v, f"{name}_pair": pair(v)}
            out.append(evaluate(conv.outputs[t.name], symbols, io).expand(v.shape))
        return tuple(out)

    def backward(self, spec: OpSpec) -> OpSpec | None:
        """A rotation again, of the outputs' gradients into the rotated inputs' (the transpose: rotation by
        -θ), with the same tables or grid angles; no table or angle is saved. An element is in its own output
        and in its partner's, so its gradient is ∂out/∂x · grad_out + ∂out_pair/∂x · grad_out_pair, the
        second being ∂out/∂x_pair at the partner: its cos, sin and sign (-sign). The tables and coordinates
        get no gradient (the binding refuses them requiring one). None where an output is not linear in its
        own input and partner (the gradient would need the inputs: not a rotation)."""
        structure = spec.structure
        at_partner = {cos: cos_pair, sin: sin_pair, cos_pair: cos, sin_pair: sin, sign: -sign}
        rotated = {s for n in structure.rotates for s in (n, f"{n}_pair")}
        grads = [gradient_name(t.name) for t in spec.outputs]

        def gradient(expr: sp.Expr, name: str, g: str) -> sp.Expr | None:
            own, partner = derivative(expr, name), derivative(expr, f"{name}_pair")
            if {str(s) for s in own.free_symbols | partner.free_symbols} & rotated:
                return None
            return sp.Symbol(g) * own + sp.Symbol(f"{g}_pair") * partner.xreplace(at_partner)

        conventions = []
        for c in structure.conventions:
            outputs = {
                gradient_name(name): gradient(c.outputs[t.name], name, g)
                for name, t, g in zip(structure.rotates, spec.outputs, grads)
            }
            if None in outputs.values():
                return None
            matches = f"the gradient of {c.name} (roundings differentiate as the identity)"
            conventions.append(Convention(name=c.name, matches=matches, outputs=outputs))
        rest = [t for t in spec.inputs if t.name not in structure.rotates]
        tensors = [
            *(
                Tensor(name=g, dims="*rows hidden", doc=f"the gradient of {t.name}")
                for g, t in zip(grads, spec.outputs)
            ),
            *rest,
            *(
                Tensor(name=gradient_name(n), dims="*rows hidden", role="output", doc=f"the gradient of {n}")
                for n in structure.rotates
            ),
        ]
        return OpSpec(
            name=f"{spec.name}_backward",
            summary=f"the gradient of {spec.name} ({spec.summary})",
            tensors=tensors,
            params=spec.params,
            structure=structure.model_copy(update={"rotates": grads, "conventions": conventions}),
            reference=backward_reference(
                spec,
                [t.name for t in tensors if t.role == "input"],
                list(structure.rotates),
                dict(zip(structure.rotates, grads)),
            ),
        )

    def check_tolerance(self, spec: OpSpec, atol: float, rtol: float) -> tuple[float, float]:
        """Grid angles reach |freq·(2·coord - 1)| ~ 1.6e4 rad at C = 4096, where an fp32 angle is exact to
        ~1e-3 rad only, and the reference (diffusers' fp32 steps) rounds in another order than this
        evaluation: their tables differ by up to ~4e-3, unit-variance outputs by up to ~3e-2. A wrong axis,
        frequency or pad moves whole elements."""
        return (max(atol, 2e-2), max(rtol, 2e-2)) if spec.structure.grid else (atol, rtol)

    @staticmethod
    def _grid_tables(spec: OpSpec, given: dict, params: dict, lead) -> tuple:
        """cos and sin [B, S, C] from the grid angles, in fp32 as the kernel computes them."""
        import torch

        grid, f32 = spec.structure.grid, torch.float32
        batch, tokens, hidden = lead.shape
        naxes = len(grid.axes)
        floats = {k: v for k, v in params.items() if k in ("hidden", "inv_hidden") or not isinstance(v, int)}
        if grid.coordinates_input:
            raw = given[grid.coordinates_input].to(f32)  # [B, axes, S]
        else:
            sizes = [int(params[n]) for n in grid.sizes]
            index = torch.arange(tokens)
            raw = torch.stack(
                [index // (torch.tensor(sizes[a + 1 :]).prod()) % sizes[a] for a in range(naxes)]
            )
            raw = raw.to(f32).unsqueeze(0).expand(batch, -1, -1)
        coords = torch.stack(
            [
                evaluate(e, floats | {axis: raw[:, a]}, None).to(f32)
                for a, (axis, e) in enumerate(zip(grid.axes, grid.coordinates))
            ],
            1,
        )  # [B, axes, S]
        pad, n_freq = hidden % (2 * naxes), hidden // (2 * naxes)
        channels = torch.arange(pad, hidden)
        pairs = (channels - pad) // 2
        freq = evaluate(
            grid.frequency, floats | {"k": (pairs // naxes).to(f32), "n_freq": float(n_freq)}, None
        )
        coord = coords[:, pairs % naxes, :].transpose(1, 2)  # [B, S, C - pad]
        angle = evaluate(grid.angle, floats | {"freq": torch.as_tensor(freq).to(f32), "coord": coord}, None)
        angle = torch.as_tensor(angle).to(f32).expand(batch, tokens, hidden - pad)
        cos = torch.cat([torch.ones(batch, tokens, pad, dtype=f32), angle.cos()], -1)
        sin = torch.cat([torch.zeros(batch, tokens, pad, dtype=f32), angle.sin()], -1)
        return cos.double(), sin.double()

    def tensor_shape(self, spec: OpSpec, tensor: Tensor, case: Case) -> tuple[int, ...]:
        structure, shape = spec.structure, tuple(case.shape)
        if tensor.dims == COORDINATES:  # [B, axes, S] beside x [B, S, C]
            return (shape[0], len(structure.grid.axes), shape[1])
        if tensor.name in (
            structure.tables or ()
        ):  # the lead's shape without the head dim, batch 1 per batch
            table = shape[:1] + shape[2:] if len(shape) == 4 else shape
            return (1, *table[1:]) if case.per_batch and len(table) == 3 else table
        if tensor is not spec.lead and len(shape) == 4 and case.k_heads:
            return (shape[0], case.k_heads, *shape[2:])
        return shape

    def example_cases(self, spec: OpSpec) -> list[Case]:
        grid = spec.structure.grid
        if grid is None:
            return [Case(shape) for shape in [(2, 7, 64), (1, 5, 2), (2, 3, 5, 128), (1, 4, 33, 96)]]
        sizes = tuple(zip(grid.sizes, (2, 3, 4)))  # a grid of 2·3·4 tokens
        return [Case((1, 24, c), params=sizes) for c in (2, 12, 100, 2048, 4096)]

    def context(self, spec: OpSpec, profile: ArchProfile, plans: list[RotaryPlan]) -> RotaryContext:
        structure, names = spec.structure, printed_names(spec)
        by_name = {t.name: t for t in spec.inputs}
        rotated, tables = (
            [by_name[n] for n in structure.rotates],
            [by_name[n] for n in structure.tables or ()],
        )
        conventions = convention_code(
            spec,
            names,
            lines=lambda c: {  # a function per output
                o: statements({f"{o}_result": e}, names) for o, e in c.outputs.items()
            },
        )
        grid = None
        if structure.grid is not None:
            g = structure.grid
            grid = GridCode(
                g.axes,
                g.sizes,
                g.coordinates_input,
                [statements({"coord": e}, names) for e in g.coordinates],
                statements({"freq": g.frequency}, names),
                statements({"angle": g.angle}, names),
            )
        lead = spec.lead.name
        fake = [f"torch.empty({t.name}.shape, dtype={lead}.dtype, device={lead}.device)" for t in rotated]
        return RotaryContext(
            conventions=conventions,
            templates=self.templates,
            fake_outputs=fake,
            pairing=structure.pairing,
            grid=grid,
            rotated=structure.rotates,
            rotated_tensors=rotated,
            tables=tables,
            table_float32=any(t.dtype == "float32" for t in tables),
            heads_expr=[f"args.{t.name}_heads" for t in rotated],
            heads_in_flight=plans[0].heads_in_flight,
        )


family = RotaryFamily()
