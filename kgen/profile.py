"""GPU architecture profiles: hardware facts from arch/*.toml, validated with pydantic."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Device(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    memory_bandwidth_gbs: float = Field(gt=0)


class PlannerFacts(BaseModel):
    """[planner]: the schedule's facts every family reads, and one table per family ([planner.<family>]) that
    the family validates with its own schema."""

    model_config = ConfigDict(extra="allow", frozen=True)
    basis: str = Field(
        min_length=1
    )  # measured on the arch, or rules carried over from another (said by explain)
    block_threads: int = Field(ge=32, multiple_of=32)


class ArchProfile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(pattern=r"^sm_\d{2,3}$")
    compute_capability: str = Field(pattern=r"^\d+\.\d$")
    sm_count: int = Field(gt=0)
    warp_size: int = Field(gt=0)
    max_access_bytes: int = Field(gt=0)  # the widest global load or store one thread issues
    max_threads_per_block: int = Field(gt=0)
    max_threads_per_sm: int = Field(gt=0)
    registers_per_sm: int = Field(gt=0)
    max_registers_per_thread: int = Field(gt=0)
    shared_memory_per_sm: int = Field(gt=0)
    max_shared_memory_per_block: int = Field(gt=0)
    l2_bytes: int = Field(gt=0)
    bf16: bool
    clusters: bool
    tma: bool  # the tensor memory accelerator (bulk tensor copies)
    async_copy: bool  # cp.async: global-to-shared copies that do not hold a register
    devices: list[Device] = Field(min_length=1)
    planner: PlannerFacts

    @model_validator(mode="after")
    def _consistent(self) -> ArchProfile:
        if self.planner.block_threads > self.max_threads_per_block:
            raise ValueError("planner.block_threads is more than max_threads_per_block")
        if self.name != "sm_" + self.compute_capability.replace(".", ""):
            raise ValueError(
                f"name {self.name!r} does not match compute_capability {self.compute_capability!r}"
            )
        return self

    @property
    def dtypes(self) -> list[str]:
        return ["float32", "float16"] + (["bfloat16"] if self.bf16 else [])

    def family_facts(self, family: str) -> dict:
        """The [planner.<family>] table (empty if the profile has none)."""
        return (self.planner.model_extra or {}).get(family, {})

    def register_cap(self, block_threads: int) -> int:
        """The 32-bit registers a thread may hold in a block of ``block_threads``."""
        return min(self.max_registers_per_thread, self.registers_per_sm // block_threads)

    @property
    def capability_number(self) -> int:
        """9.0 -> 90, as in -gencode arch=compute_90."""
        return int(self.compute_capability.replace(".", ""))


class TunedChoice(BaseModel):
    """One measured winner of `kgen tune`: threads per row (row ops; per block for the others) for
    the op's rows up to ``max_row_bytes`` (None: the op's only configuration)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    op: str
    dtype: str
    max_row_bytes: int | None = None
    threads: int = Field(gt=0)
    rule_threads: int = Field(gt=0)
    shapes: list[str]
    rule_us: float = Field(gt=0)  # summed over the shapes
    tuned_us: float = Field(gt=0)
    others: dict[str, float] = {}  # the other candidates: threads -> µs
    # shapes it was not tuned on, launched in the same configuration: the rule's and the choice's µs there
    held_out: list[str] = []
    held_rule_us: float | None = None
    held_tuned_us: float | None = None


class TuningTable(BaseModel):
    """arch/tuning/<arch>.toml: what `kgen tune` measured, read by the planner."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    arch: str
    device: str
    date: str
    torch: str
    # a candidate replaces the rule only when this much faster: run-to-run noise is ~1 % (H200)
    margin: float = Field(default=0.02, ge=0)
    choices: list[TunedChoice] = []
    file: str = Field(default="", exclude=True)  # how messages name the file it was read from (not written)

    def threads(self, op: str, dtype: str, max_row_bytes: int | None, rule: int) -> tuple[int | None, str]:
        """(threads, why) where this configuration was measured against today's ``rule``; else (None, what
        the rule's reason adds): an entry tuned against another rule, from before a profile change, is
        stale and named, the rule stands."""
        c = next(
            (c for c in self.choices if (c.op, c.dtype, c.max_row_bytes) == (op, dtype, max_row_bytes)), None
        )
        if c is None or c.rule_threads == rule:
            return (c.threads, self.why(c)) if c else (None, "")
        return None, (
            f"; {self.file or f'arch/tuning/{self.arch}.toml'} has a `kgen tune` entry here measured when "
            f"the rule was {c.rule_threads} threads: stale, left out (re-run `kgen tune {op}`)"
        )

    def why(self, c: TunedChoice) -> str:
        others = "".join(f", {t}: {us:.1f} µs" for t, us in c.others.items())
        faster = [t for t, us in c.others.items() if us < c.tuned_us]
        if c.threads != c.rule_threads:
            verdict = f"tuned on the {self.device} {self.date}, instead of the rule's {c.rule_threads}"
        elif faster:  # a candidate measured faster, within the noise margin: the rule stays
            verdict = (
                f"the rule's, kept by kgen tune on the {self.device} {self.date}: {', '.join(faster)} "
                f"measured faster but by less than its {self.margin:.0%} noise margin"
            )
        else:
            verdict = f"the rule's, confirmed by kgen tune on the {self.device} {self.date}"
        return (
            f"{c.threads}: {verdict} ({self.file or f'arch/tuning/{self.arch}.toml'}): {c.tuned_us:.1f} µs"
            + ("" if c.threads == c.rule_threads else f", the rule {c.rule_us:.1f} µs")
            + others
            + f" at {', '.join(c.shapes)}"
            + (
                f"; held out {', '.join(c.held_out)}: {c.held_tuned_us:.1f} µs, the rule "
                f"{c.held_rule_us:.1f} µs"
                if c.held_out
                else ""
            )
        )
