"""The project a build writes: what it is built from (a `Target`: the loaded spec, profile, dtypes and tuning
table; a `MultiTarget`: one project for several archs), how it is named on the Hub and on disk, and how its
files reach the disk (atomically)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from .catalog import arch_names, load_profile, load_spec, load_tuning, spec_hash
from .dsl import OpSpec
from .errors import UsageError
from .planner import check_dtype
from .profile import ArchProfile, TuningTable


def kernel_name(op: str, arch: str) -> str:
    """The Hub name: lowercase and dash-separated, e.g. rmsnorm-sm90."""
    return f"{op}-{arch}".replace("_", "-").replace("sm-", "sm")


def python_name(kernel_name: str) -> str:
    """The Python package of a project: its Hub name with underscores, e.g. rmsnorm_sm90."""
    return kernel_name.replace("-", "_")


@dataclass(frozen=True)
class Target:
    """One project: an op's spec for one arch profile and some of its dtypes, loaded once."""

    spec: OpSpec
    profile: ArchProfile
    dtypes: tuple[str, ...]
    spec_hash: str
    tuning: TuningTable | None = field(default=None, compare=False)  # the op's `kgen tune` table

    @property
    def op(self) -> str:
        return self.spec.name

    @property
    def arch(self) -> str:
        return self.profile.name

    @property
    def kernel_name(self) -> str:
        return kernel_name(self.op, self.arch)

    @property
    def python_name(self) -> str:
        return python_name(self.kernel_name)


def resolve_target(op: str, arch: str, dtypes: list[str] | tuple[str, ...] | None = None) -> Target:
    """Loads the op's spec, the arch's profile and tuning table; every dtype the arch runs unless
    ``dtypes``."""
    spec, profile = load_spec(op), load_profile(arch)
    for dtype in dtypes or []:
        check_dtype(profile, dtype)
    return Target(
        spec, profile, tuple(dtypes or profile.dtypes), spec_hash(op), load_tuning(profile.name, op)
    )


@dataclass(frozen=True)
class MultiTarget:
    """One project for several archs (kernel-builder's list of cuda-capabilities): each arch's plans
    compiled for its own target, the binding picking the newest arch the running device can run."""

    targets: tuple[Target, ...]  # oldest arch first
    every_arch: bool = False  # the archs are every profile kgen has: the project takes the op's own name

    @property
    def spec(self) -> OpSpec:
        return self.targets[0].spec

    @property
    def op(self) -> str:
        return self.spec.name

    @property
    def spec_hash(self) -> str:
        return self.targets[0].spec_hash

    @property
    def archs(self) -> list[str]:
        return [t.arch for t in self.targets]

    @property
    def kernel_name(self) -> str:
        """rmsnorm for every arch, rmsnorm-sm80-sm90 for some."""
        return self.op.replace("_", "-") if self.every_arch else kernel_name(self.op, "-".join(self.archs))

    @property
    def python_name(self) -> str:
        return python_name(self.kernel_name)


def resolve_multi_target(
    op: str, archs: list[str], dtypes: list[str] | tuple[str, ...] | None = None
) -> MultiTarget:
    """One project for ``archs`` ("all": every profile): each arch with the requested dtypes it runs (all it
    runs without ``dtypes``); a dtype no arch runs is refused."""
    every = archs == ["all"]
    names = sorted(
        dict.fromkeys(arch_names() if every else archs), key=lambda a: load_profile(a).capability_number
    )
    if len(names) < 2:
        raise UsageError(f"a project for several archs needs two or more, got {names}")
    profiles = [load_profile(a) for a in names]
    for profile in profiles:
        if dtypes and not set(dtypes) & set(profile.dtypes):
            raise UsageError(
                f"{profile.name} runs none of the dtypes asked for ({', '.join(dtypes)}; it runs "
                f"{', '.join(profile.dtypes)}): leave it out or ask for one it runs"
            )
    targets = [
        resolve_target(op, p.name, [d for d in dtypes if d in p.dtypes] if dtypes else None) for p in profiles
    ]
    return MultiTarget(tuple(targets), every and set(names) == set(arch_names()))


def write_tree(files: dict[str, str | bytes], out_dir: Path, keep: tuple[str, ...] = ()) -> None:
    """Writes ``files`` as the whole content of ``out_dir``, atomically: they go to a sibling temporary
    folder that replaces ``out_dir`` only once complete, under a lock on the parent folder so concurrent
    writers of the same output take turns. Entries named in ``keep`` (e.g. a previous build/) are carried
    over. Folders get the permissions of a plain mkdir (the umask's)."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.parent / f".{out_dir.name}.new.{uuid.uuid4().hex[:12]}"
    staging.mkdir()
    try:
        for rel, text in files.items():
            path = staging / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(text if isinstance(text, bytes) else text.encode())
        with _locked(out_dir.parent):
            if not out_dir.exists():
                os.replace(staging, out_dir)
                return
            kept = [name for name in keep if (out_dir / name).exists()]
            for name in kept:
                os.replace(out_dir / name, staging / name)
            old = staging.with_name(staging.name.replace(".new.", ".old."))
            try:
                os.replace(out_dir, old)
                os.replace(staging, out_dir)
            except BaseException:
                if old.exists() and not out_dir.exists():
                    os.replace(old, out_dir)
                for name in kept:
                    if (staging / name).exists():
                        os.replace(staging / name, out_dir / name)
                raise
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def _locked(folder: Path):
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
