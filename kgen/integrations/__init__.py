"""kgen's kernels in real models: transformers (through `kernels.kernelize`) and diffusers (LTX-Video)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..builder import build_project
from ..render import resolve_target, write_project


def built(op: str, arch: str, root: Path, step: Callable[[str], None]) -> Path:
    """root/<op>-<arch>, written and compiled for this torch (a no-op when it is up to date)."""
    target = resolve_target(op, arch)
    project = write_project(target, root)
    build_project(project, target, step)
    return project
