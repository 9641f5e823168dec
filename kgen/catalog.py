"""Finds and loads what kgen reads: op specs (ops/, $KGEN_OPS_PATH), structure families from outside kgen
($KGEN_FAMILIES_PATH), arch profiles and their tuning tables (arch/) and the benchmark shape suite
(bench/shapes.toml), turning validation failures into errors that name the file, the field and what is
expected."""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import os
import sys
import types
from functools import cache
from pathlib import Path
from typing import Annotated

import tomllib
from pydantic import BeforeValidator, Field, StrictBool, StrictFloat, StrictInt, ValidationError

from .dsl import OpSpec, _Model
from .errors import KgenError, ProfileError, SpecError
from .families import families, family_of, register
from .families.base import Case, Family
from .profile import ArchProfile, TuningTable
from .spec_helpers import helper_imports

_PACKAGE = Path(__file__).resolve().parent
_SPECS = "kgen_ops"  # the module package specs load under
_FAMILIES = "kgen_families"  # ... and families from $KGEN_FAMILIES_PATH (importable by the specs using them)


def data_dir(kind: str) -> Path:
    """ops/, arch/, bench/ or codegen_templates/: inside the wheel (kgen/_data) or the source checkout."""
    for candidate in (_PACKAGE / "_data" / kind, _PACKAGE.parent / kind):
        if candidate.is_dir():
            return candidate
    raise SpecError(f"kgen's {kind}/ directory is missing from the installation at {_PACKAGE}")


def _path_dirs(variable: str) -> list[Path]:
    return [Path(p) for p in os.environ.get(variable, "").split(os.pathsep) if p]


def _user_dirs(variable: str) -> list[Path]:
    """$KGEN_OPS_PATH or $KGEN_FAMILIES_PATH (os.pathsep-separated): the user's folders (an entry that is
    none: an error)."""
    for d in (dirs := _path_dirs(variable)):
        if not d.is_dir():
            raise SpecError(
                f"${variable} names {d}, which {'is not a folder' if d.exists() else 'does not exist'}: "
                "fix or remove the entry"
            )
    return dirs


def ops_dirs() -> list[Path]:
    """The user's spec folders ($KGEN_OPS_PATH), searched first, then kgen's ops/."""
    return _user_dirs("KGEN_OPS_PATH") + [data_dir("ops")]


def op_names() -> list[str]:
    """The ops of every spec folder; a user's spec may not take the name of one of kgen's own or of another
    folder's."""
    found = {d.resolve(): sorted(p for p in d.glob("*.py") if not p.stem.startswith("_")) for d in ops_dirs()}
    seen: dict[str, Path] = {}
    for path in (p for paths in found.values() for p in paths):  # the user's folders first, kgen's ops/ last
        if (other := seen.setdefault(path.stem, path)) != path:
            whose = "kgen's own op" if path.parent.resolve() == data_dir("ops").resolve() else "the op"
            raise SpecError(
                f"spec {path.stem!r} ({other}) has the name of {whose} {path.stem!r} ({path}), which it "
                "would hide (kgen's other ops load theirs by name): rename it, its file and its OpSpec name"
            )
    return sorted(seen)


def arch_names() -> list[str]:
    """The arch profiles, oldest first (sm_75 ... sm_120)."""
    return sorted((p.stem for p in data_dir("arch").glob("sm_*.toml")), key=lambda n: (len(n), n))


def _format(err: ValidationError, title: str | None = None) -> str:
    """One line per error: Model.field.path: what is expected (got what)."""
    lines = []
    for e in err.errors():
        where = ".".join([title or err.title, *(str(part) for part in e["loc"])])
        got = e.get("input")
        shown = "" if isinstance(got, dict) or got is None else f" (got {got!r})"
        lines.append(f"  {where}: {e['msg']}{shown}")
    return "\n".join(lines)


def _frames(tb):
    while tb is not None:
        yield tb
        tb = tb.tb_next


def load_families() -> list[Family]:
    """Registers the family modules of $KGEN_FAMILIES_PATH (each defines `family = <a Family>`), once per
    folder list; they import as kgen_families.<module>."""
    return _load_families(tuple(_user_dirs("KGEN_FAMILIES_PATH")))


@cache
def _load_families(dirs: tuple[Path, ...]) -> list[Family]:
    package = sys.modules.get(_FAMILIES) or types.ModuleType(_FAMILIES)
    package.__path__ = [str(d) for d in dirs]
    sys.modules[_FAMILIES] = package
    found = []
    for path in sorted(p for d in dirs if d.is_dir() for p in d.glob("*.py") if not p.stem.startswith("_")):
        try:
            module = importlib.import_module(f"{_FAMILIES}.{path.stem}")
        except ValidationError as err:
            raise SpecError(f"family module {path} is invalid:\n{_format(err)}") from None
        family = getattr(module, "family", None)
        if family is None:
            raise SpecError(f"family module {path} must define `family = <a kgen.families.base.Family>`")
        found.append(register(family))
    return found


_loading: list[set[str]] = []  # the specs a spec being loaded loads in turn (its dependencies)
_dependencies: dict[str, set[str]] = {}
_helpers: dict[str, list[Path]] = {}  # the helper modules beside it each spec imports (in its hash)


def load_spec(name: str) -> OpSpec:
    """The op's spec, loaded once; a spec loaded while another loads is recorded as its dependency."""
    if _loading:
        _loading[-1].add(name)
    return _load_spec(name)


def _did_you_mean(name: str, known: list[str]) -> str:
    """ " (did you mean 'x'?)" for the closest known name, when one is close (its letters swapped are: esp
    is taken for eps; ties go to the longer common prefix: sm_101 is taken for sm_100, not sm_120)."""

    def closeness(k: str) -> tuple[float, int]:
        ratio = max(difflib.SequenceMatcher(None, name, k).ratio(), 0.8 * (sorted(name) == sorted(k)))
        return ratio, len(os.path.commonprefix([name, k]))

    best = max(known, key=closeness, default=None)
    return f" (did you mean {best!r}?)" if best is not None and closeness(best)[0] >= 0.8 else ""


@cache
def _load_spec(name: str) -> OpSpec:
    load_families()
    # a file name found in a spec folder: never a path out of it
    path = (
        next((d / f"{name}.py" for d in ops_dirs() if (d / f"{name}.py").is_file()), None)
        if name in op_names()
        else None
    )
    if path is None:
        raise SpecError(
            f"unknown op {name!r}{_did_you_mean(name, op_names())}; "
            f"known ops: {', '.join(op_names()) or '(none)'}"
        )
    module_name = f"{_SPECS}.{name}"
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[module_name] = module
    _loading.append(set())
    try:
        with helper_imports(path.parent, ops_dirs()) as used:
            loader_spec.loader.exec_module(module)
    except Exception as err:  # noqa: BLE001 - any failure of the user's module is reported as the spec's
        line = next(
            (
                tb.tb_lineno
                for tb in _frames(err.__traceback__)
                if Path(tb.tb_frame.f_code.co_filename) == path
            ),
            None,
        )
        where = f"{path}:{line}" if line else str(path)
        if isinstance(err, ValidationError):
            raise SpecError(f"spec {name!r} ({where}) is invalid:\n{_format(err)}") from None
        hint = (
            " (a family module: is its folder on $KGEN_FAMILIES_PATH?)"
            if isinstance(err, ModuleNotFoundError) and (err.name or "").startswith(_FAMILIES)
            else ""
        )
        raise SpecError(f"spec {name!r} ({where}) failed to load: {type(err).__name__}: {err}{hint}") from err
    finally:
        _dependencies[name] = _loading.pop()
    _helpers[name] = sorted(set(used))
    spec = getattr(module, "spec", None)
    if not isinstance(spec, OpSpec):
        raise SpecError(
            f"spec {name!r} ({path}) must define `spec = OpSpec(...)`; if it is a helper module, not a spec, "
            f"name it _{name}.py (kgen loads no file starting with '_' as a spec)"
        )
    if spec.name != name:
        raise SpecError(f"spec {name!r} ({path}): name {spec.name!r} must equal the file name {name!r}")
    family_of(spec)  # a structure no registered family plans fails here, naming the spec
    if unused := spec.unused_params():
        raise SpecError(
            f"spec {name!r} ({path}) is invalid:\n  OpSpec.params: param {unused[0]!r} is not used by the "
            "math of any convention; use its symbol in an expression, or remove the param"
        )
    return spec


load_spec.cache_clear = _load_spec.cache_clear  # tests point $KGEN_OPS_PATH elsewhere


def backward_spec(name: str) -> OpSpec | None:
    """The op's derived backward (<op>_backward), or None where its family derives none yet."""
    spec = load_spec(name)
    return family_of(spec).backward(spec)


def spec_hash(name: str) -> str:
    """Content hash of the spec module, of the helper modules beside it that it imports and of the specs it
    loads: it names the spec version in emitted headers."""
    load_spec(name)
    digest, seen, todo = hashlib.sha256(), set(), [name]
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            for file in [Path(sys.modules[f"{_SPECS}.{current}"].__file__), *_helpers.get(current, ())]:
                digest.update(file.read_bytes())
            todo += sorted(_dependencies.get(current, ()))
    return digest.hexdigest()[:12]


def _user_folder(name: str) -> Path | None:
    """The $KGEN_OPS_PATH folder holding the op's spec; None for kgen's own ops."""
    load_spec(name)
    folder = Path(sys.modules[f"{_SPECS}.{name}"].__file__).resolve().parent
    return None if folder == data_dir("ops").resolve() else folder


def spec_origin(name: str) -> str:
    """Where the op's spec lives, as generated files name it: `ops/<op>.py` for kgen's own,
    `$KGEN_OPS_PATH/<op>.py` for a user's (no machine's own path lands in a generated file)."""
    return f"ops/{name}.py" if _user_folder(name) is None else f"$KGEN_OPS_PATH/{name}.py"


def tuning_file(op: str, arch: str) -> tuple[Path, str]:
    """The op's `kgen tune` table for the arch and how messages name it: kgen's arch/tuning/<arch>.toml for
    its own ops, tuning/<arch>.toml beside a user's spec (kgen's installation is not written for them)."""
    folder = _user_folder(op)
    if folder is None:
        return data_dir("arch") / "tuning" / f"{arch}.toml", f"arch/tuning/{arch}.toml"
    return folder / "tuning" / f"{arch}.toml", f"$KGEN_OPS_PATH/tuning/{arch}.toml"


@cache
def load_profile(name: str) -> ArchProfile:
    load_families()
    path = data_dir("arch") / f"{name}.toml"
    if name not in arch_names():
        raise ProfileError(
            f"unknown arch {name!r}{_did_you_mean(name, arch_names())}; "
            f"known archs: {', '.join(arch_names())}"
        )
    where = f"arch profile {name!r} ({path})"
    try:
        profile = ArchProfile.model_validate(tomllib.loads(path.read_text()))
    except tomllib.TOMLDecodeError as err:
        raise ProfileError(f"{where} is not valid TOML: {err}") from None
    except ValidationError as err:
        raise ProfileError(f"{where} is invalid:\n{_format(err)}") from None
    names = [f.name for f in families()]
    unknown = sorted(set(profile.planner.model_extra or {}) - set(names))
    if unknown:
        raise ProfileError(
            f"{where} is invalid:\n  [planner.{unknown[0]}]: no structure family is named "
            f"{unknown[0]!r}; known: {', '.join(names)}"
        )
    for family in families():
        try:
            family.check_facts(profile)
        except ValidationError as err:
            raise ProfileError(
                f"{where} is invalid:\n{_format(err, f'ArchProfile.planner.{family.name}')}"
            ) from None
        except ValueError as err:
            raise ProfileError(f"{where} is invalid:\n  {err}") from None
    return profile


@cache
def load_tuning(arch: str, op: str) -> TuningTable | None:
    """The `kgen tune` table of the arch that holds the op's entries (`tuning_file`), if there is one."""
    path, name = tuning_file(op, arch)
    if not path.is_file():
        return None
    try:
        return TuningTable.model_validate(tomllib.loads(path.read_text())).model_copy(update={"file": name})
    except (tomllib.TOMLDecodeError, ValidationError) as err:
        raise ProfileError(f"tuning table {path} is invalid: {err}") from None


def _shape_entry(value):
    if isinstance(value, list):
        return {"shape": value}
    if not isinstance(value, dict):
        raise ValueError("a shape is a list of dims ([8192, 4096]) or a table {shape = [...], ...}")
    return value


def _shape_list(value):
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        raise ValueError(f"one shape where a list of shapes is expected: write shapes = [{value}]")
    return value


Dim = Annotated[StrictInt, Field(gt=0)]


class ShapeCase(_Model):
    """A shape of the suite: [dims...], or {shape = [...], per_batch = true, params = {...}, k_heads = N}."""

    shape: list[Dim] = Field(min_length=1)
    per_batch: StrictBool = False
    params: dict[str, StrictInt | Annotated[StrictFloat, Field(allow_inf_nan=False)]] = {}
    k_heads: Dim | None = None


class ShapeTable(_Model):
    """An op's table ([<op>]) in a shapes file."""

    shapes: Annotated[
        list[Annotated[ShapeCase, BeforeValidator(_shape_entry)]], BeforeValidator(_shape_list)
    ] = []
    max_time_vs_compile: Annotated[float, Field(gt=0)] | None = None  # bench's bar, where it has one


def suite(op: str) -> list[Case]:
    """The op's benchmark shapes (`suite_table`); none for an op no shapes file lists."""
    return [
        Case(tuple(e.shape), e.per_batch, tuple(e.params.items()), e.k_heads) for e in suite_table(op).shapes
    ]


def shapes_files() -> list[Path]:
    """Where benchmark shapes are read, first match wins: shapes.toml in each $KGEN_OPS_PATH folder (beside
    a user's specs), then kgen's bench/shapes.toml."""
    return [d / "shapes.toml" for d in _user_dirs("KGEN_OPS_PATH")] + [data_dir("bench") / "shapes.toml"]


def shape_tables(path: Path) -> dict[str, ShapeTable]:
    """A shapes file's tables, each named for a known op and validated."""
    try:
        tables = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise SpecError(f"{path} is not valid TOML: {err}") from None
    where, known, found = f"shapes file {path} is invalid:\n ", op_names(), {}
    for op, table in tables.items():
        if not isinstance(table, dict):
            raise SpecError(f"{where} {op}: a key outside the [<op>] tables (each op's shapes go in its own)")
        if op not in known:
            hint = _did_you_mean(op, known)
            raise SpecError(f"{where} [{op}]: no op is named {op!r}{hint}; known ops: {', '.join(known)}")
        try:
            found[op] = ShapeTable.model_validate(table)
        except ValidationError as err:
            raise SpecError(f"shapes file {path} is invalid:\n{_format(err, f'[{op}]')}") from None
    return found


def suite_table(op: str) -> ShapeTable:
    """The op's table ([<op>]) from the first shapes file that has one, each shape's params the op's (an
    integer param's value an integer); an empty one where none does."""
    for path in shapes_files():
        if path.is_file() and op in (tables := shape_tables(path)):
            for i, case in enumerate(tables[op].shapes):
                where = f"shapes file {path} is invalid:\n  [{op}].shapes.{i}.params.{{}}:"
                check_params(op, case.params, where, SpecError)
            return tables[op]
    return ShapeTable()


def check_params(op: str, given: dict[str, float], where: str, error: type[KgenError]) -> None:
    """``given`` names the op's params, an integer param's value is an integer, a positive one's > 0; else
    ``error`` at ``where`` (formatted with the param's name)."""
    params = {p.name: p for p in load_spec(op).params}
    for name, value in given.items():
        if name not in params:
            hint, known = _did_you_mean(name, list(params)), ", ".join(params) or "(none)"
            raise error(f"{where.format(name)} {op} has no param {name!r}{hint}; its params: {known}")
        if params[name].integer and value != int(value):
            raise error(f"{where.format(name)} {name} is an integer param (got {value!r})")
        if params[name].positive and not value > 0:
            raise error(f"{where.format(name)} {name} must be > 0 (got {value!r})")
