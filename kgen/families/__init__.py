"""The structure families: one module per structure kind, each owning its DSL node, checks, plan, render
context, shapes and templates (row_reduce, elementwise, rotary, column_reduce, softmax_loss). The core asks
this registry for a spec's family and never which one it got. A family from outside kgen (a module on
$KGEN_FAMILIES_PATH defining `family = ...`) is registered by kgen.catalog when specs load."""

from __future__ import annotations

from ..dsl import OpSpec, Structure
from ..errors import SpecError
from . import column_reduce, elementwise, rotary, row_reduce, softmax_loss
from .base import Family

_FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    """Adds a family; its name is its structure's kind. Registering the same family again is a no-op."""
    if not (
        isinstance(family, Family)
        and isinstance(getattr(family, "name", None), str)
        and isinstance(getattr(family, "structure", None), type)
        and issubclass(family.structure, Structure)
    ):
        raise SpecError(
            f"{family!r} is not a structure family: a kgen.families.base.Family with a name and a "
            "Structure subclass"
        )
    kind = family.structure.model_fields["kind"].default
    if kind != family.name:
        raise SpecError(
            f"family {family.name!r}: its structure {family.structure.__name__} has kind {kind!r}; "
            "they must be equal"
        )
    known = _FAMILIES.get(family.name)
    if known is not None and type(known) is not type(family):
        raise SpecError(
            f"two families are named {family.name!r}: {type(known).__module__} and {type(family).__module__}"
        )
    _FAMILIES[family.name] = family
    return family


def family_of(spec: OpSpec) -> Family:
    family = _FAMILIES.get(spec.structure.kind)
    if family is None or not isinstance(spec.structure, family.structure):
        raise SpecError(
            f"spec {spec.name!r}: no registered family plans structure {type(spec.structure).__name__} "
            f"(kind {spec.structure.kind!r}); known: {', '.join(sorted(_FAMILIES))}"
        )
    return family


def families() -> list[Family]:
    return [_FAMILIES[name] for name in sorted(_FAMILIES)]


for _module in (row_reduce, elementwise, rotary, column_reduce, softmax_loss):
    register(_module.family)
