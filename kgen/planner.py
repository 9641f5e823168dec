"""The schedule: from an op spec, an arch profile and a dtype to the kernel
configurations that get compiled (one per hidden-size bucket) and, for a given
shape, the configuration the launcher picks. Reads only profile fields; every
choice carries the fact or rule that set it."""

from __future__ import annotations

from dataclasses import dataclass, field

from .catalog import KgenError
from .dsl import OpSpec
from .profile import ArchProfile, TuningTable

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
VECTOR_BYTES = 16  # the widest global access a thread can issue (LDG.E.128 / STG.E.128)


@dataclass(frozen=True)
class Bucket:
    """One compiled kernel configuration, serving rows up to ``max_row_bytes`` (None: any)."""

    max_row_bytes: int | None
    elems_per_access: int
    threads_per_row: int
    rows_per_block: int
    max_accesses_per_thread: int  # the register array length (registers storage only)
    storage: str  # "registers" | "shared" | "global"
    columns_fit: bool  # per-column inputs fit in registers beside the row (loaded with it in one-wave grids)
    reasons: dict[str, str] = field(compare=False, hash=False)
    heads_in_flight: int = 1  # rotary: heads a thread loads before it stores the first

    @property
    def block_threads(self) -> int:
        return self.threads_per_row * self.rows_per_block

    @property
    def reduction(self) -> str:
        return "warp shuffle" if self.threads_per_row <= 32 else "warp shuffle + one shared-memory exchange"

    @property
    def vectorized(self) -> bool:
        return self.elems_per_access > 1


@dataclass(frozen=True)
class KernelPlan:
    """Every configuration compiled for (op, arch, dtype): vector buckets then scalar ones."""

    op: str
    arch: str
    dtype: str
    elem_bytes: int
    buckets: list[Bucket]
    notes: dict[str, str]
    kind: str = "row_reduce"  # the spec's structure


def check_dtype(profile: ArchProfile, dtype: str) -> None:
    if dtype not in DTYPE_BYTES:
        raise KgenError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPE_BYTES)}")
    if dtype not in profile.dtypes:
        raise KgenError(f"{profile.name} ({profile.devices[0].name}) has no {dtype} arithmetic "
                        f"(profile: bf16 = {str(profile.bf16).lower()}); supported dtypes: {', '.join(profile.dtypes)}")


def plan_kernel(spec: OpSpec, profile: ArchProfile, dtype: str, tuning: TuningTable | None = None) -> KernelPlan:
    """The rules of the profile, except where ``tuning`` (a `kgen tune` table) measured better
    threads for a vector configuration."""
    check_dtype(profile, dtype)
    tuned = (lambda max_row_bytes: tuning.threads(spec.name, dtype, max_row_bytes)) if tuning else lambda _: None
    if spec.structure.kind != "row_reduce":
        return _plan_elementwise(spec, profile, dtype, tuned(None))
    elem = DTYPE_BYTES[dtype]
    facts = profile.planner
    buckets = []
    for elems_per_access in (VECTOR_BYTES // elem, 1):
        buckets += _buckets(profile, elem, elems_per_access, len(spec.row_values), len(spec.column_inputs),
                            tuned if elems_per_access > 1 else lambda _: None)
    notes = {
        "vector path": f"{VECTOR_BYTES}-byte accesses ({VECTOR_BYTES // elem} × {dtype}) when "
                       f"{', '.join(t.name for t in spec.tensors)} are {VECTOR_BYTES}-byte aligned and hidden and "
                       f"row strides are multiples of {VECTOR_BYTES // elem}: the widest global access a thread can issue",
        "scalar path": "otherwise one element per access, the row re-read from L2 instead of cached: "
                       "correct for any alignment and any hidden size",
        "clusters": ("not used: one block holds rows up to "
                     f"{_largest_on_chip(profile) // 1024} KB on chip, beyond any hidden size in the shape suite"
                     if profile.clusters else f"not available on {profile.name} (profile: clusters = false)"),
        "block_threads": f"{facts.block_threads} threads per block when rows are short (profile planner.block_threads)",
    }
    return KernelPlan(spec.name, profile.name, dtype, elem, buckets, notes)


def _plan_elementwise(spec: OpSpec, profile: ArchProfile, dtype: str, tuned: tuple[int, str] | None) -> KernelPlan:
    """One thread per access of each output: no reduction, nothing kept, so the only choices are
    the access width and the block size. Rotary ops are planned the same way; a thread rotates its
    channels of one token across the heads, fetching cos and sin once."""
    elem = DTYPE_BYTES[dtype]
    threads = tuned[0] if tuned else profile.planner.block_threads
    kind = spec.structure.kind
    reasons = {"threads_per_row": f"{threads} threads per block, each one access of every tensor at one "
                                  "position (profile planner.block_threads); rows are flattened",
               "rows_per_block": "rows are flattened: a block covers consecutive positions",
               "storage": "nothing kept: each element is read once and written once"}
    interleaved = kind == "rotary" and spec.structure.pairing == "interleaved"  # pairs in one access
    heads = 2 if interleaved else 1  # rotary: measured on the H200, bf16, q [1, 32, T, 128], k 8 heads
    if kind == "rotary":
        reasons["threads_per_row"] = (f"{threads} threads per block, each one access of a token's channels in "
                                      "every head (cos and sin fetched once per token), unless that leaves fewer "
                                      "threads than one full wave: then heads are split in chunks")
        reasons["heads_in_flight"] = (
            "1 head in flight per thread: a rotate_half thread holds cos and sin for both halves, and two heads kept "
            "91 registers (25 % occupancy); one head, 72 registers, ran T = 2048 16 % and T = 8192 8 % faster"
            if heads == 1 else "2 heads in flight per thread, both loaded before either is stored: with interleaved "
            "pairs (64 registers) one head at a time ran 10-12 % slower")
    if tuned:
        reasons["threads_per_row"] = tuned[1] + " (threads per block)"
    scalar = 2 if interleaved else 1
    buckets = [Bucket(None, n, threads, 1, 1, "global", False, reasons, heads) for n in (VECTOR_BYTES // elem, scalar)]
    what = "each half of a packed one" if kind == "elementwise" else "rotate_half pairs need a multiple of twice that"
    notes = {
        "vector path": f"{VECTOR_BYTES}-byte accesses ({VECTOR_BYTES // elem} × {dtype}) when every tensor "
                       f"is {VECTOR_BYTES}-byte aligned and hidden and strides are multiples of "
                       f"{VECTOR_BYTES // elem} ({what}): the widest global access a thread can issue",
        "scalar path": f"otherwise {'one pair' if scalar == 2 else 'one element'} per access: correct for any "
                       "alignment and any hidden size",
        "block_threads": reasons["threads_per_row"],
    } | ({"heads in flight": reasons["heads_in_flight"]} if kind == "rotary" else {})
    return KernelPlan(spec.name, profile.name, dtype, elem, buckets, notes, kind)


def _largest_on_chip(profile: ArchProfile) -> int:
    regs = profile.planner.threads_per_row[-1].threads * profile.planner.row_register_bytes_per_thread
    return max(regs, profile.max_shared_memory_per_block - _SCRATCH_BYTES)


_SCRATCH_BYTES = 4 * 1024  # reserved for the per-warp partial sums of the reductions


def _buckets(profile: ArchProfile, elem: int, elems_per_access: int, row_values: int,
             column_inputs: int, tuned=lambda _: None) -> list[Bucket]:
    facts = profile.planner
    access_bytes = elem * elems_per_access
    out = []
    for step in facts.threads_per_row:
        choice = tuned(step.max_row_bytes)
        threads = choice[0] if choice else step.threads
        rows_per_block = max(1, facts.block_threads // threads)
        reasons = {
            "threads_per_row": choice[1] if choice else
            f"{threads}: rows up to {step.max_row_bytes} B (profile planner.threads_per_row)",
            "rows_per_block": (f"{rows_per_block}: {facts.block_threads} threads per block / {threads} per row"
                               if rows_per_block > 1 else "1: a row needs the whole block"),
        }
        columns = False
        if elems_per_access > 1:
            accesses = -(-step.max_row_bytes // (access_bytes * threads))
            budget = facts.row_register_bytes_per_thread
            if row_values * accesses * access_bytes > budget:
                if choice:
                    raise KgenError(f"arch/tuning/{profile.name}.toml: {threads} threads per row for rows up to "
                                    f"{step.max_row_bytes} B would hold {row_values * accesses * access_bytes} B "
                                    f"per thread, over the {budget} B register budget; re-run `kgen tune`")
                continue  # several row values would not fit: longer steps or shared memory take these rows
            reasons["storage"] = (f"registers: {accesses} × {access_bytes} B per thread, within the {budget} B "
                                  "budget (profile planner.row_register_bytes_per_thread): one read, one write")
            storage = "registers"
            held = (row_values + column_inputs) * accesses * access_bytes
            columns = column_inputs > 0 and held <= budget
            if column_inputs:
                reasons["columns"] = (f"{held} B per thread with the row fits the {budget} B budget"
                                      if columns else f"{held} B per thread with the row would exceed the "
                                      f"{budget} B budget")
        else:
            accesses = 1
            reasons["storage"] = "global: scalar path re-reads the row (from L2) instead of caching it"
            storage = "global"
        out.append(Bucket(step.max_row_bytes, elems_per_access, threads, rows_per_block, accesses, storage,
                          columns, reasons))

    threads = facts.threads_per_row[-1].threads
    largest_in_registers = threads * facts.row_register_bytes_per_thread
    shared_limit = (profile.max_shared_memory_per_block - _SCRATCH_BYTES) // row_values
    if elems_per_access > 1 and shared_limit > largest_in_registers:
        out.append(Bucket(shared_limit, elems_per_access, threads, 1, 1, "shared", False, {
            "threads_per_row": f"{threads}: the longest ladder step",
            "rows_per_block": "1: a row needs the whole block",
            "storage": (f"shared memory: beyond {largest_in_registers // 1024} KB in registers, up to the "
                        f"profile's {profile.max_shared_memory_per_block // 1024} KB per block less "
                        f"{_SCRATCH_BYTES // 1024} KB scratch: one read, one write"),
        }))
    out.append(Bucket(None, elems_per_access, threads, 1, 1, "global", False, {
        "threads_per_row": f"{threads}: the longest ladder step",
        "rows_per_block": "1: a row needs the whole block",
        "storage": "global: the row exceeds every on-chip budget; the second pass re-reads it (mostly from L2)",
    }))
    return out


@dataclass(frozen=True)
class LaunchPlan:
    kernel: KernelPlan
    bucket: Bucket
    rows: int
    hidden: int
    grid: int
    shared_bytes: int
    min_bytes: int
    vector_reason: str
    widened: str | None  # why the launcher took a wider configuration than the row size asks for
    columns_early: bool  # per-column inputs loaded with the row (one-wave grids) or after the reduction

    def roofline_us(self, bandwidth_gbs: float) -> float:
        return self.min_bytes / (bandwidth_gbs * 1e9) * 1e6


    def choices(self, profile: ArchProfile) -> list[tuple[str, str, str]]:
        """(choice, value, why) for every knob of this launch: what `kgen explain` prints."""
        b, kernel = self.bucket, self.kernel
        rows = [("accesses", f"{b.elems_per_access * kernel.elem_bytes} B ({b.elems_per_access} elements)",
                 self.vector_reason + "; " + kernel.notes["vector path" if b.vectorized else "scalar path"])]
        if kernel.kind != "row_reduce":
            wave = profile.sm_count * profile.max_threads_per_sm // b.block_threads
            capped = f"; rotary grids stop at one full wave ({wave}), threads walking tokens" if kernel.kind == "rotary" else ""
            return rows + [
                ("block", f"{b.block_threads} threads", b.reasons["threads_per_row"]),
                ("grid", f"{self.grid} blocks", f"ceil({self.rows} × {self.hidden} / {b.elems_per_access} accesses / "
                 f"{b.block_threads}) on {profile.sm_count} SMs{capped}"),
                ("storage", "none", b.reasons["storage"])] + (
                [("heads in flight", str(b.heads_in_flight), b.reasons["heads_in_flight"])]
                if kernel.kind == "rotary" else [])
        rows += [
            ("threads per row", str(b.threads_per_row), self.widened or b.reasons["threads_per_row"]),
            ("rows per block", str(b.rows_per_block), b.reasons["rows_per_block"]),
            ("block", f"{b.block_threads} threads", "threads per row × rows per block"),
            ("reduction", b.reduction, "threads per row <= warp size (32)" if b.threads_per_row <= 32
             else f"{b.threads_per_row // 32} warps per row exchange partial sums once"),
            ("row lives in", b.storage, b.reasons["storage"])]
        if "columns" in b.reasons:
            waves = "one wave: every block resident" if self.columns_early or not b.columns_fit else \
                "several waves: registers are better spent on occupancy"
            rows.append(("weight", "with the row" if self.columns_early else "after the reduction",
                         f"{b.reasons['columns']}; {waves}"))
        return rows + [
            ("clusters", "no", kernel.notes["clusters"]),
            ("grid", f"{self.grid} blocks", f"ceil({self.rows} rows / {b.rows_per_block}) on {profile.sm_count} SMs "
             f"({self.grid / profile.sm_count:.1f} blocks per SM)"),
            ("shared memory", f"{self.shared_bytes} B dynamic", "the row" if self.shared_bytes else "only reduction scratch")]


def min_bytes(spec: OpSpec, rows: int, hidden: int, elem: int) -> int:
    """Each input read once and each output written once (broadcast inputs counted per row)."""
    per_row = sum(2 if t.packed else 1 for t in spec.tensors if t.per_row)
    return (rows * per_row + len(spec.column_inputs)) * hidden * elem


def plan_launch(spec: OpSpec, profile: ArchProfile, dtype: str, rows: int, hidden: int,
                tuning: TuningTable | None = None) -> LaunchPlan:
    """The configuration the generated launcher picks for a contiguous, aligned tensor."""
    kernel = plan_kernel(spec, profile, dtype, tuning)
    if rows < 1 or hidden < 1:
        raise KgenError(f"shape must have rows >= 1 and hidden >= 1, got rows={rows}, hidden={hidden}")
    elem = kernel.elem_bytes
    row_bytes = hidden * elem
    vector = hidden % (VECTOR_BYTES // elem) == 0
    vector_reason = (f"hidden {hidden} is a multiple of {VECTOR_BYTES // elem}: {VECTOR_BYTES}-byte accesses"
                     if vector else
                     f"hidden {hidden} is not a multiple of {VECTOR_BYTES // elem}: scalar accesses")
    if kernel.kind != "row_reduce":
        b = kernel.buckets[0 if vector else 1]  # one configuration per access width
        per_thread = b.elems_per_access * (2 if kernel.kind == "rotary" and spec.structure.pairing == "half" else 1)
        grid = -(-rows * (hidden // per_thread) // b.block_threads)
        if kernel.kind == "rotary":
            grid = min(grid, profile.sm_count * profile.max_threads_per_sm // b.block_threads)
        return LaunchPlan(kernel, b, rows, hidden, grid, 0, min_bytes(spec, rows, hidden, elem), vector_reason,
                          None, False)
    candidates = [b for b in kernel.buckets if b.elems_per_access == (VECTOR_BYTES // elem if vector else 1)]
    index = next(i for i, b in enumerate(candidates) if b.max_row_bytes is None or row_bytes <= b.max_row_bytes)
    bucket, widened = widen(candidates, index, rows, hidden, profile), None
    if bucket is not candidates[index]:
        widened = (f"{-(-rows // candidates[index].rows_per_block)} blocks would be under "
                   f"{profile.planner.min_blocks_per_sm} per SM (profile planner.min_blocks_per_sm): "
                   f"the launcher spreads each row over {bucket.threads_per_row} threads instead of "
                   f"{candidates[index].threads_per_row}")
    grid = -(-rows // bucket.rows_per_block)
    columns_early = bucket.columns_fit and one_wave(grid, bucket, profile)
    shared = row_bytes if bucket.storage == "shared" else 0
    return LaunchPlan(kernel, bucket, rows, hidden, grid, shared, min_bytes(spec, rows, hidden, elem), vector_reason,
                      widened, columns_early)


def one_wave(grid: int, bucket: Bucket, profile: ArchProfile) -> bool:
    """Whether every block is resident at once. Then latency dominates and the weight is loaded
    with the row; with several waves occupancy dominates and the weight, re-read after the
    reduction, costs no registers (bench, H200: loading it early slowed 8192×4096 bf16 by 13 %).
    This estimate assumes full occupancy; the generated launcher asks the CUDA occupancy API."""
    return grid * bucket.block_threads <= profile.sm_count * profile.max_threads_per_sm


def widen(candidates: list[Bucket], index: int, rows: int, hidden: int, profile: ArchProfile) -> Bucket:
    """The grid-fill rule, as the generated launcher applies it: while the grid would have fewer
    than min_blocks_per_sm blocks per SM, take the next wider register configuration, as long as
    every thread keeps at least one access of the row."""
    min_blocks = profile.planner.min_blocks_per_sm * profile.sm_count
    while True:
        b = candidates[index]
        nxt = candidates[index + 1] if index + 1 < len(candidates) else None
        if (-(-rows // b.rows_per_block) >= min_blocks or nxt is None or nxt.storage != "registers"
                or b.storage != "registers" or nxt.threads_per_row <= b.threads_per_row
                or nxt.threads_per_row * nxt.elems_per_access > hidden):
            return b
        index += 1
