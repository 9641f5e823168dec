"""Finds and loads op specs (ops/) and arch profiles (arch/), turning validation
failures into KgenError messages that name the file, the field and what is expected."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tomllib
from functools import cache
from pathlib import Path

from pydantic import ValidationError

from .dsl import OpSpec
from .profile import ArchProfile, TuningTable

_PACKAGE = Path(__file__).resolve().parent


class KgenError(Exception):
    """A user-facing error: the CLI prints its message without a traceback."""


def data_dir(kind: str) -> Path:
    """ops/, arch/ or codegen_templates/: inside the wheel (kgen/_data) or the source checkout."""
    for candidate in (_PACKAGE / "_data" / kind, _PACKAGE.parent / kind):
        if candidate.is_dir():
            return candidate
    raise KgenError(f"kgen's {kind}/ directory is missing from the installation at {_PACKAGE}")


def ops_dirs() -> list[Path]:
    """KGEN_OPS_PATH (os.pathsep-separated) lets users add their own spec folders, searched first."""
    extra = [Path(p) for p in os.environ.get("KGEN_OPS_PATH", "").split(os.pathsep) if p]
    return extra + [data_dir("ops")]


def op_names() -> list[str]:
    return sorted({p.stem for d in ops_dirs() if d.is_dir() for p in d.glob("*.py") if not p.stem.startswith("_")})


def arch_names() -> list[str]:
    return sorted(p.stem for p in data_dir("arch").glob("sm_*.toml"))


def _format(err: ValidationError) -> str:
    """One line per error: Model.field.path: what is expected (got what)."""
    lines = []
    for e in err.errors():
        where = ".".join([err.title, *(str(part) for part in e["loc"])])
        got = e.get("input")
        shown = "" if isinstance(got, dict) or got is None else f" (got {got!r})"
        lines.append(f"  {where}: {e['msg']}{shown}")
    return "\n".join(lines)


def _frames(tb):
    while tb is not None:
        yield tb
        tb = tb.tb_next


@cache
def load_spec(name: str) -> OpSpec:
    # a file name found in a spec folder: never a path out of it
    path = next((d / f"{name}.py" for d in ops_dirs() if (d / f"{name}.py").is_file()), None) if name in op_names() else None
    if path is None:
        raise KgenError(f"unknown op {name!r}; known ops: {', '.join(op_names()) or '(none)'}")
    module_name = f"kgen_ops.{name}"
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[module_name] = module
    try:
        loader_spec.loader.exec_module(module)
    except ValidationError as err:
        line = next((tb.tb_lineno for tb in _frames(err.__traceback__)
                     if Path(tb.tb_frame.f_code.co_filename) == path), None)
        where = f"{path}:{line}" if line else str(path)
        raise KgenError(f"spec {name!r} ({where}) is invalid:\n{_format(err)}") from None
    spec = getattr(module, "spec", None)
    if not isinstance(spec, OpSpec):
        raise KgenError(f"spec {name!r} ({path}) must define `spec = OpSpec(...)`")
    if spec.name != name:
        raise KgenError(f"spec {name!r} ({path}): name {spec.name!r} must equal the file name {name!r}")
    return spec


def spec_hash(name: str) -> str:
    """Content hash of the spec module: it names the spec version in emitted headers."""
    load_spec(name)
    path = Path(sys.modules[f"kgen_ops.{name}"].__file__)
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


@cache
def load_profile(name: str) -> ArchProfile:
    path = data_dir("arch") / f"{name}.toml"
    if name not in arch_names():
        raise KgenError(f"unknown arch {name!r}; known archs: {', '.join(arch_names())}")
    try:
        return ArchProfile.model_validate(tomllib.loads(path.read_text()))
    except tomllib.TOMLDecodeError as err:
        raise KgenError(f"arch profile {name!r} ({path}) is not valid TOML: {err}") from None
    except ValidationError as err:
        raise KgenError(f"arch profile {name!r} ({path}) is invalid:\n{_format(err)}") from None


@cache
def load_tuning(arch: str) -> TuningTable | None:
    """The committed `kgen tune` table of an arch (arch/tuning/<arch>.toml), if there is one."""
    path = data_dir("arch") / "tuning" / f"{arch}.toml"
    if not path.is_file():
        return None
    try:
        return TuningTable.model_validate(tomllib.loads(path.read_text()))
    except (tomllib.TOMLDecodeError, ValidationError) as err:
        raise KgenError(f"tuning table {path} is invalid: {err}") from None
