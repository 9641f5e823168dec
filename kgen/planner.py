"""The schedule: from an op spec, an arch profile and a dtype to the kernel configurations that get
compiled and, for a given shape, the configuration the launcher picks. The spec's structure family makes
every choice, reading only profile fields and tuning tables; each choice carries the fact or rule that set
it."""

from __future__ import annotations

from .dsl import OpSpec
from .errors import PlanError
from .families import family_of
from .families.base import DTYPE_BYTES, Case, KernelPlan, LaunchPlan
from .profile import ArchProfile, TuningTable


def check_dtype(profile: ArchProfile, dtype: str) -> None:
    if dtype not in DTYPE_BYTES:
        raise PlanError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPE_BYTES)}")
    if dtype not in profile.dtypes:
        raise PlanError(
            f"{profile.name} ({profile.devices[0].name}) has no {dtype} arithmetic "
            f"(profile: bf16 = {str(profile.bf16).lower()}); supported dtypes: {', '.join(profile.dtypes)}"
        )


def plan_kernel(
    spec: OpSpec, profile: ArchProfile, dtype: str, tuning: TuningTable | None = None
) -> KernelPlan:
    """The rules of the profile, except where ``tuning`` (a `kgen tune` table) measured better threads."""
    check_dtype(profile, dtype)
    return family_of(spec).plan(spec, profile, dtype, tuning)


def plan_launch(
    spec: OpSpec,
    profile: ArchProfile,
    dtype: str,
    shape: tuple[int, ...],
    tuning: TuningTable | None = None,
    k_heads: int | None = None,
    per_batch: bool = False,
    params: dict[str, float] | None = None,
) -> LaunchPlan:
    """The configuration the generated launcher picks for a contiguous, aligned tensor of ``shape`` (leading
    dims, then hidden: [rows, hidden], or a rotary op's [batch, heads, tokens, head size], its second rotated
    tensor with ``k_heads`` heads where given), broadcast inputs per batch ([..., 1, hidden]) where
    ``per_batch``, else per token. A shape the generated binding refuses is refused here with its reason (the
    checks that read the op's params where ``params`` gives them: a grid's sizes against the tokens)."""
    kernel, family = plan_kernel(spec, profile, dtype, tuning), family_of(spec)
    case = Case(tuple(shape), per_batch, tuple((params or {}).items()), k_heads)
    if not shape or case.rows < 1 or shape[-1] < 1:
        raise PlanError(f"shape must have rows >= 1 and hidden >= 1, got {tuple(shape)}")
    if k_heads is not None and not family.takes_k_heads(spec, tuple(shape)):
        raise PlanError("k heads are for a rotary op that rotates q and k, with a [B, H, T, D] shape")
    if per_batch and not any(t.broadcast for t in spec.tensors):
        raise PlanError(
            f"per batch: {spec.name} has no broadcast input (read per batch or per token) for it to change"
        )
    if refused := family.refuses(spec, kernel, case):
        raise PlanError(refused)
    return family.launch(spec, profile, kernel, case)
