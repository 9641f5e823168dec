"""The rotary family: pairwise rotation of q (and k) by angles read from cos/sin tables or computed in the
kernel from each token's place on a latent grid or given positions (text-model RoPE; LTX-Video's, Flux's and
Wan's RoPE: the grid angles in rotary_grid.py), optionally after an RMS norm of each head or token in the
same pass (the q/k norms before a model's RoPE).

DSL: `Rotary(pairing, rotates, tables | grid, norm, conventions)`. Plan: a thread keeps one channel group
and walks tokens, rotating every head of a token with cos and sin fetched once; the grid stops at one full
wave; heads in flight per pairing (profile [planner.rotary]); a norm sums across the lanes that share a head
or token with warp shuffles. The derived backward: rotary_backward.py. Templates:
codegen_templates/rotary/."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..codegen import evaluate, statements
from ..dsl import Identifier, OpSpec, Structure, Tensor
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
from .rotary_backward import WIDE_PARTIAL_BYTES, backward_spec, cos, cos_pair, sign, sin, sin_pair  # noqa: F401
from .rotary_grid import COORDINATES, GridAngles, GridCode, coord, freq, k, n_freq  # noqa: F401 (the specs' names)
from .rotary_norm import WEIGHT_DIMS, NormCode, RotaryNorm, inv_count, row_sum, rstd, weight  # noqa: F401

# every arch profile's planner.block_threads and max_access_bytes (tests/test_profiles.py): the example heads
BLOCK_THREADS, ACCESS_BYTES = 256, 16


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
    norm: RotaryNorm | None = None
    # a backward through the norm: the forward's rotated inputs, read again for the norm's statistic (then the
    # rotated tensors are the outputs' gradients, and the outputs the inputs' gradients, then the weights')
    norm_inputs: list[Identifier] | None = None

    @property
    def packed_tables(self) -> bool:  # rotate_half's tables held as loaded: 16-bit elements two to a register
        return bool(self.tables) and self.pairing == "half"

    @property
    def batch_shares_angles(self) -> bool:  # grid angles of the token's place alone; no norm's sum per batch
        by_token = self.norm is not None and self.norm.over == "token"
        return bool(self.grid) and not self.grid.coordinates_input and not self.norm_inputs and not by_token

    @property
    def split_shares(self) -> bool:  # a head norm's two weights: chunks may split by tensor (the plan's)
        return self.norm_inputs is not None and self.norm.over == "head" and len(self.rotates) > 1

    dims = ("*rows hidden", COORDINATES, *WEIGHT_DIMS.values())
    # a backward through a norm: its weights' gradients, [D] or [H·D] (check says when)
    column_outputs = tuple(WEIGHT_DIMS.values())
    # the binding's locals and helpers (the kernels reach tensors as args.<name> only), and the rotation's
    # symbols
    declares = frozenset(
        {
            "batch",
            "tokens",
            "as_bhtd",
            "load_floats",
            "store_floats",
            "sign",
            "norm_elems",
            "norm_lanes",
            "heads",
        }
    )

    def assigned(self, spec: OpSpec) -> list[str]:
        """An output per rotated tensor; a backward through a norm's weight gradients come from the norm."""
        return [t.name for t in spec.outputs[: len(self.rotates)]]

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
        weights = [by_name.get(n) for n in self.norm.weights] if self.norm else []
        normed = [by_name.get(n) for n in self.norm_inputs or ()]
        if None in tables or set(spec.inputs) - set(rotated) - set(tables) - set(given) - set(weights) - set(
            normed
        ):
            raise ValueError(
                "a rotary op takes the tensors it rotates, the cos and sin tables it names in "
                "`tables` (or a grid's coordinates input), its norm's weights (and a backward through the "
                "norm its norm_inputs), and nothing else"
            )
        if self.norm is not None:
            self.norm.check(spec, self.rotates)
        if any(t.dtype != "io" for t in spec.outputs):
            raise ValueError("a rotary op's outputs have the I/O dtype")
        if self.norm_inputs is not None and (
            self.norm is None
            or len(normed) != len(rotated)
            or any(t is None or t.dims != "*rows hidden" or t.dtype != "io" or t.optional for t in normed)
        ):
            raise ValueError(
                "structure.norm_inputs: a backward through a norm names one required '*rows hidden' input in "
                "the I/O dtype per rotated tensor (the forward's, read again)"
            )
        weight_dims = [t.dims for t in weights] if self.norm_inputs else []
        if [t.dims for t in spec.outputs] != ["*rows hidden"] * len(rotated) + weight_dims:
            raise ValueError(
                f"a rotary op has one output per rotated input (a backward through a norm then one per norm "
                f"weight, shaped like it): inputs {self.rotates}, outputs {[t.name for t in spec.outputs]}"
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
            if tables or self.pairing != "interleaved":
                raise ValueError("grid angles serve interleaved pairs, with no cos/sin tensors")
            self.grid.check(spec)
        return (
            set(self.rotates)
            | {f"{n}_pair" for n in self.rotates}
            | {"cos", "sin", "sign", "cos_pair", "sin_pair"}
        )


class RotaryFacts(BaseModel):
    """[planner.rotary] of an arch profile."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    # by pairing; head_norm: with a norm over each head (its weights read per head)
    heads_in_flight: dict[Literal["interleaved", "half", "head_norm"], int] = Field(min_length=3)
    # resident blocks of block_threads an SM a forward kernel asks of the compiler (__launch_bounds__) on its
    # bf16 / fp32 vector path with 32-bit indices; 1 asks nothing
    forward_blocks_per_sm: int = Field(ge=1)
    split_shares: dict[Literal["interleaved", "half"], bool] = Field(min_length=2)  # a head norm's backward


@dataclass(frozen=True)
class RotaryPlan(KernelPlan):
    heads_in_flight: int  # heads a thread loads before it stores the first
    resident_blocks: int  # resident blocks an SM asked of the compiler (forward vector path; 1: none asked)
    wave_threads: int  # one full wave of the profile's board: the grid stops there, threads walking tokens
    sm_threads: int  # profile max_threads_per_sm: a forward's wave is the device's SMs × this
    partial_threads: int  # a backward's weight-gradient partition (a norm over a token): threads at most
    held_elems: int  # ... its elements of each tensor a thread holds per token (held_kernel)
    split_shares: bool  # chunks never straddle the tensors, a thread keeps its chunk (one weight's shares)


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
    resident_blocks: int
    structure: Rotary  # its packed_tables
    norm: NormCode | None
    rotated_outputs: list[Tensor]  # one per rotated tensor (the outputs, or a backward's input gradients)
    norm_inputs: list[Tensor]  # a backward through the norm: the forward's rotated inputs, read again
    weight_gradients: list[Tensor]  # ... and its weights' gradients, summed over every head and token


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
        fake_helpers="rotary/fake_helpers.py.j2",
    )

    def plan(self, spec: OpSpec, profile: ArchProfile, dtype: str, tuning: TuningTable | None) -> RotaryPlan:
        """A thread rotates its channels of one token across the heads, fetching cos and sin once."""
        elem, pairing = DTYPE_BYTES[dtype], spec.structure.pairing
        vector = profile.max_access_bytes // elem
        tuned, why = (
            tuning.threads(spec.name, dtype, None, profile.planner.block_threads) if tuning else (None, "")
        )
        threads = tuned or profile.planner.block_threads
        per_head_norm = spec.structure.norm is not None and spec.structure.norm.over == "head"
        facts = self.check_facts(profile)
        heads = facts.heads_in_flight["head_norm" if per_head_norm else pairing]
        # a backward through the norm keeps what it needs: the fused q/k norm's (118 registers) would spill
        resident_blocks = facts.forward_blocks_per_sm if spec.structure.norm_inputs is None else 1
        reasons = {
            "threads_per_row": why + " (threads per block)"
            if tuned
            else f"{threads} threads per block (profile planner.block_threads), each one access of a token's "
            "channels in every head (cos and sin fetched once per token), unless that leaves fewer threads "
            f"than one full wave: then heads are split in chunks{why}",
            "rows_per_block": "tokens are flattened: a block covers consecutive channel groups",
            "storage": "nothing kept: each element is read once and written once",
        }
        # interleaved: a pair is adjacent, one access; with a norm, the vector path's elements one by one, so
        # that the lanes of a head are the same on both paths
        scalar = vector if spec.structure.norm else 2 if pairing == "interleaved" else 1
        buckets = [Bucket(None, n, threads, 1, 1, "global", False, reasons) for n in (vector, scalar)]
        half = pairing == "half"
        what = " (rotate_half pairs: hidden a multiple of twice that)" if half else ""
        any_size = ": correct for any alignment" + " and any hidden size" * (not spec.structure.norm)
        scalar_path = {1: "one element per access", 2: "one pair per access"}.get(
            scalar, f"the vector path's {vector} elements per thread, one per access"
        ) + any_size
        notes = vector_notes(dtype, vector, elem, "every tensor is", what) | {
            "scalar path": f"otherwise {scalar_path}",
            "block_threads": reasons["threads_per_row"],
            "heads in flight": f"{heads} head{'s' if heads > 1 else ''} in flight per thread with "
            + ("a norm over each head" if per_head_norm else f"{'rotate_half' if half else pairing} pairs")
            + (", all loaded before the first is stored, held as loaded until their math" * (heads > 1))
            + " (profile planner.rotary.heads_in_flight)",
        }
        if resident_blocks > 1:
            most = profile.registers_per_sm // (resident_blocks * threads)
            notes["registers"] = (
                f"the vector path with 32-bit indices, bfloat16 and float32: {resident_blocks} blocks an SM "
                f"asked of the compiler (≤ {most} registers "
                "a thread; profile planner.rotary.forward_blocks_per_sm); float16 and the other paths keep "
                "what they need"
            )
        partial_threads = profile.sm_count * profile.family_facts("column_reduce")["resident_threads_per_sm"]
        if norm := spec.structure.norm:
            notes |= norm.notes(spec.structure.norm_inputs is not None, partial_threads)
        if split := spec.structure.split_shares and facts.split_shares[pairing]:
            notes["weight shares"] = "a thread's chunk in one tensor (profile planner.rotary.split_shares)"
        if spec.structure.packed_tables:
            notes["tables"] = (
                "a token's cos and sin at the thread's channels held as loaded (16-bit elements two to a "
                "register), converted per head: fewer registers, more resident blocks (ptxas)"
            )
        if grid := spec.structure.grid:
            why = "as the matched library's float64 tables" if grid.precision == "float64" else "the default"
            every = " and by every batch (a thread takes every batch's heads of its token)"
            notes["angles"] = (
                f"computed in the kernel in {grid.precision} ({why}): a thread's frequencies once (it keeps "
                "its channels), sin and cos once per token, shared by every head and rotated tensor"
                f"{every * spec.structure.batch_shares_angles}; no table read"
            )
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
            resident_blocks,
            profile.sm_count * profile.max_threads_per_sm,
            profile.max_threads_per_sm,
            partial_threads,
            40,  # 5 heads of 8 16-bit elements: 127 registers (bench/results/qk-norm-wan-backward-2026-12-04)
            split,
        )

    def launch(self, spec: OpSpec, profile: ArchProfile, kernel: RotaryPlan, case: Case) -> LaunchPlan:
        rows, hidden = case.rows, case.shape[-1]
        half = spec.structure.pairing == "half"
        vector = hidden % (kernel.vector_elems * (2 if half else 1)) == 0
        b = kernel.buckets[0 if vector else 1]
        per_thread = b.elems_per_access * (2 if half else 1)  # rotate_half: an access of each half
        grid, walk = self._grid(spec, kernel, case, per_thread, b.block_threads)
        choices = [
            (
                "accesses",
                f"{b.elems_per_access * kernel.elem_bytes} B ({b.elems_per_access} elements)",
                kernel.notes["vector path" if vector else "scalar path"],
            ),
            ("block", f"{b.block_threads} threads", b.reasons["threads_per_row"]),
            ("grid", f"{grid} blocks", walk),
            ("storage", "none", b.reasons["storage"]),
            ("heads in flight", str(kernel.heads_in_flight), kernel.notes["heads in flight"]),
        ]
        if "registers" in kernel.notes:
            choices.append(("resident blocks", f"{kernel.resident_blocks} an SM", kernel.notes["registers"]))
        if "norm" in kernel.notes:
            choices.append(("norm", f"over a {spec.structure.norm.over}", kernel.notes["norm"]))
        if "angles" in kernel.notes:
            choices.append(("angles", spec.structure.grid.precision, kernel.notes["angles"]))
        if "weight gradients" in kernel.notes:
            per_head = spec.structure.norm.over == "token"
            most = kernel.partial_threads // b.block_threads if per_head else grid  # head norm: a row a block
            each = "of every head's channels" if per_head else "per weight"
            partials = f"≤ {most} fp32 partial rows {each}"
            choices.append(("weight gradients", partials, kernel.notes["weight gradients"]))
        if "weight gradients" in kernel.notes and per_head:  # held_kernel's grid, where a block holds a token
            batch, each, tokens, _ = self._layout(spec, case)
            per, tokens, heads, chunks = b.elems_per_access * (2 if half else 1), batch * tokens, sum(each), 1
            while chunks * (kernel.held_elems // per) < heads:
                chunks *= 2
            if (slots := b.block_threads // (hidden // per * chunks)) >= 1:
                grid, groups = min(-(-tokens // slots), most), hidden // per
                why = f"{tokens} tokens, {slots} a block (a token's {heads} heads: {groups} channel groups × "
                choices[2] = ("grid", f"{grid} blocks", why + f"{chunks} chunks), at most {most}")
                held = -(-heads // chunks)
                choices[1] = (
                    "block",
                    f"{b.block_threads} threads",
                    f"{b.block_threads} threads per block (profile planner.block_threads), {slots} token"
                    f"{'s' if slots > 1 else ''} a block, {groups * chunks} threads a token",
                )
                choices[4] = (
                    "heads in flight",
                    f"{held} held",
                    f"a thread holds {held} of a token's heads of x and of the incoming gradient as loaded "
                    f"(≤ {kernel.held_elems} elements of each) through the token's sums and its second pass",
                )
        return LaunchPlan(
            kernel, b, rows, hidden, grid, 0, min_bytes(self, spec, case, kernel.elem_bytes), choices
        )

    def refuses(self, spec: OpSpec, kernel: KernelPlan, case: Case) -> str | None:
        """The binding's shape checks: 1 to 4 dims, whole pairs, a grid's layout, a norm's head sizes (D over
        the elements a lane sums: an access's, of each half for rotate_half)."""
        structure, shape, x = spec.structure, tuple(case.shape), spec.lead.name
        got = f"got shape {list(shape)}"
        if not 1 <= len(shape) <= 4:
            return f"{spec.name}: {x} must have 1 to 4 dims ([B, H, T, D], [B, S, C], [T, D] or [D]), {got}"
        if shape[-1] % 2:
            return f"{spec.name}: {x}'s last dim holds pairs and must be even, {got}"
        elems = kernel.vector_bytes // kernel.elem_bytes * (2 if structure.pairing == "half" else 1)
        refused = (structure.grid and structure.grid.refuses(x, shape, dict(case.params))) or (
            structure.norm and structure.norm.refuses(shape, elems, kernel.dtype, kernel.block_threads)
        )
        return f"{spec.name}: {refused}" if refused else None

    def takes_k_heads(self, spec: OpSpec, shape: tuple[int, ...]) -> bool:
        return len(spec.structure.rotates) > 1 and len(shape) == 4  # k's [B, Hk, T, D] beside q's

    @staticmethod
    def _layout(spec: OpSpec, case: Case) -> tuple[int, list[int], int, int]:
        """``case`` as the binding sees it (as_bhtd): batch, each rotated tensor's heads, tokens, D."""
        shape = tuple(case.shape)
        batch, lead, tokens, hidden = (
            (shape[0], 1, *shape[1:]) if len(shape) == 3 else (1,) * (4 - len(shape)) + shape
        )
        return batch, [lead] + [case.k_heads or lead] * (len(spec.structure.rotates) - 1), tokens, hidden

    def _grid(
        self, spec: OpSpec, kernel: RotaryPlan, case: Case, per_thread: int, threads: int
    ) -> tuple[int, str]:
        """The generated launch_config's grid: a thread keeps a channel group of a chunk of the heads; chunks
        until the threads fill one full wave (one chunk for a token's norm); at most that wave (a head norm's
        backward with wide partial rows: its weights' partition), threads walking the rest."""
        batch, heads, tokens, hidden = self._layout(spec, case)
        groups, total, wave = hidden // per_thread, sum(heads), kernel.wave_threads
        by_token = spec.structure.norm is not None and spec.structure.norm.over == "token"
        partition = spec.structure.norm_inputs is not None and not by_token  # a head norm's weights' rows
        partition &= wave // threads * len(heads) * hidden * 4 > WIDE_PARTIAL_BYTES  # ... wide: the partition
        most = kernel.partial_threads if partition else wave  # the grid's threads at most
        together = batch if spec.structure.batch_shares_angles else 1  # the batches a thread takes at once
        batch //= together
        chunks = 1 if by_token else min(total, max(1, -(-wave // (batch * tokens * groups))))
        per = -(-total // chunks)
        if split := kernel.split_shares:  # a thread keeps its chunk: threads in groups × chunks
            chunks = sum(-(-h // per) for h in heads)
        else:  # as many chunks as hold a head, the heads spread evenly over them (the launcher's)
            per = -(-total // (chunks := -(-total // per)))
        keep = groups * (chunks if split else 1)
        step = keep // math.gcd(keep, threads)  # the thread count a multiple of keep
        blocks = min(-(-batch * tokens * groups * chunks // threads), most // threads)
        blocks = -(-blocks // step) * step  # (far below gridDim.x's limit: at most a wave)
        items = batch * tokens * groups * chunks
        why = (
            f"{batch * tokens} tokens × {groups} channel groups ({per_thread} elements a thread"
            + (", an access of each half" if spec.structure.pairing == "half" else "")
            + f") × {chunks} chunk{'s' if chunks > 1 else ''} of ≤ {per} of the {total} heads"
            + f" ({' + '.join(map(str, heads))})" * (len(heads) > 1)
            + f" = {items} threads, in blocks of {threads}; at most "
            + ("the weights' gradient partition" if partition else "one full wave")
            + f" ({most // threads} blocks: {most} threads), threads walking tokens"
            + f" (each token with its {together} batches' heads)" * (together > 1)
            + ("" if kernel.notes.get("weight gradients") else "; a launch counts its device's SMs")
        )
        if blocks > most // threads:  # the grid's threads a multiple of keep
            why += (
                f"; rounded up to a multiple of {step} blocks: a thread keeps its channel group as it walks"
            )
        if split:
            why += "; no chunk straddles two tensors' heads, a thread keeps its chunk"
        if (rounds := -(-items // (blocks * threads))) > 1:
            why += f"; a thread walks ≤ {rounds} (token, chunk) items"
        return blocks, why

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
            cos, sin = structure.grid.tables(given, values, lead)
        if structure.pairing == "interleaved":
            sign = torch.tensor([-1.0, 1.0], dtype=torch.float64).repeat(hidden // 2)
        else:
            sign = torch.cat([torch.full((hidden // 2,), -1.0), torch.ones(hidden // 2)]).double()

        def pair(v):  # each element's partner
            if structure.pairing == "interleaved":
                return v.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
            return torch.cat([v[..., hidden // 2 :], v[..., : hidden // 2]], -1)

        tables = {"cos": cos, "sin": sin, "sign": sign, "cos_pair": pair(cos), "sin_pair": pair(sin)}
        io, out, weight_grads = io_rounding(lead.dtype), [], []
        for i, (name, t) in enumerate(zip(structure.rotates, spec.outputs)):
            v = given[name].double()
            norm_weight = given[structure.norm.weights[i]] if structure.norm else None
            if structure.norm and not structure.norm_inputs:
                v = structure.norm.normalize(v, norm_weight, values, io)
            symbols = values | tables | {name: v, f"{name}_pair": pair(v)}
            value = evaluate(conv.outputs[t.name], symbols, io).expand(v.shape)
            if structure.norm_inputs:  # the gradient of the normed values, carried through the norm
                value, grad_weight = structure.norm.backward(
                    given[structure.norm_inputs[i]].double(), norm_weight, value, values, io
                )
                weight_grads.append(grad_weight)
            out.append(value)
        return (*out, *weight_grads)

    def backward(self, spec: OpSpec) -> OpSpec | None:
        return backward_spec(spec)

    def check_tolerance(self, spec: OpSpec, atol: float, rtol: float) -> tuple[float, float]:
        """Grid angles reach |freq·(2·coord - 1)| ~ 1.6e4 rad at C = 4096, where an fp32 angle is exact to
        ~1e-3 rad only, and the reference (diffusers' fp32 steps) rounds in another order than this
        evaluation: their tables differ by up to ~4e-3, unit-variance outputs by up to ~3e-2. A wrong axis,
        frequency or pad moves whole elements."""
        return (max(atol, 2e-2), max(rtol, 2e-2)) if spec.structure.grid else (atol, rtol)

    def tensor_shape(self, spec: OpSpec, tensor: Tensor, case: Case) -> tuple[int, ...]:
        structure, shape = spec.structure, tuple(case.shape)
        by_name = {t.name: t for t in spec.tensors}
        if structure.norm_inputs:  # a backward through a norm: its reads and outputs shaped as the forward's
            like = dict(zip(structure.norm_inputs, structure.rotates))
            weight_grads = [t.name for t in spec.outputs if t.dims != "*rows hidden"]
            like |= dict(zip(weight_grads, structure.norm.weights))
            if tensor.name in like:
                return self.tensor_shape(spec, by_name[like[tensor.name]], case)
        if structure.norm and tensor.name in structure.norm.weights:  # [D], or [H·D] of its tensor's heads
            heads = 1 if len(shape) < 4 else shape[1]
            if len(shape) == 4 and case.k_heads and structure.norm.weights.index(tensor.name) > 0:
                heads = case.k_heads
            return (shape[-1] * (heads if structure.norm.over == "token" else 1),)
        if tensor.dims == COORDINATES:  # [B, axes, S] beside x [B, S, C] or [B, H, S, D]
            return (shape[0], len(structure.grid.axes), shape[-2])
        if tensor.name in (
            structure.tables or ()
        ):  # the lead's shape without the head dim, batch 1 per batch
            table = shape[:1] + shape[2:] if len(shape) == 4 else shape
            return (1, *table[1:]) if case.per_batch and len(table) == 3 else table
        # the second rotated tensor (k) and its output: k's heads where they differ from q's
        seconds = structure.rotates[1:] + [t.name for t in spec.outputs[1 : len(structure.rotates)]]
        if tensor.name in seconds and len(shape) == 4 and case.k_heads:
            return (shape[0], case.k_heads, *shape[2:])
        return shape

    def example_cases(self, spec: OpSpec) -> list[Case]:
        grid = spec.structure.grid
        if grid is None:
            cases = [Case(shape) for shape in [(2, 7, 64), (1, 5, 2), (2, 3, 5, 128), (1, 4, 33, 96)]]
        else:
            cases = grid.example_cases()
        if norm := spec.structure.norm:  # the head sizes a norm serves in every dtype (16-byte accesses)
            lane = ACCESS_BYTES * (2 if spec.structure.pairing == "half" else 1)  # bytes a lane keeps
            return [
                c
                for c in cases
                if not any(norm.refuses(c.shape, lane // e, "", BLOCK_THREADS) for e in (2, 4))
            ]
        return cases

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
        grid = structure.grid.code(names) if structure.grid is not None else None
        backward = structure.norm_inputs is not None
        threads = plans[0].block_threads
        norm = structure.norm.code(names, by_name, threads, backward) if structure.norm is not None else None
        norm_inputs = [by_name[n] for n in structure.norm_inputs or ()]
        weight_gradients = spec.outputs[len(rotated) :]
        weights = structure.norm.weights if backward else []
        fake = [f"_output_like({t.name})" for t in rotated] + [f"{w}.new_empty({w}.shape)" for w in weights]
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
            resident_blocks=plans[0].resident_blocks,
            structure=structure,
            norm=norm,
            rotated_outputs=spec.outputs[: len(rotated)],
            norm_inputs=norm_inputs,
            weight_gradients=weight_gradients,
        )


family = RotaryFamily()
