"""Shared fixtures. GPU tests (marker `gpu`) skip where there is no CUDA device; toolchain
tests (marker `toolchain`) skip without nvcc or a CUDA build of torch, unless
KGEN_REQUIRE_TOOLCHAIN=1 (CI sets it) turns the skip into a failure."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from kgen.builder import build_project, device_arch, load
from kgen.render import resolve_target, write_project

REQUIRE_TOOLCHAIN = os.environ.get("KGEN_REQUIRE_TOOLCHAIN") == "1"


def toolchain_missing() -> str | None:
    if shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").is_file():
        return "nvcc not found"
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is not a CUDA build"
    return None


def pytest_collection_modifyitems(config, items):
    missing = toolchain_missing()
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
        if "toolchain" in item.keywords and missing and not REQUIRE_TOOLCHAIN:
            item.add_marker(pytest.mark.skip(reason=missing))


@pytest.fixture(scope="session")
def build_root(tmp_path_factory) -> Path:
    root = os.environ.get("KGEN_TEST_BUILD_ROOT")
    return Path(root) if root else tmp_path_factory.mktemp("kgen-build")


@pytest.fixture(scope="session")
def built(build_root):
    """built(op, arch=None): the op's project, compiled (once per session) and loaded through `kernels`."""
    cache = {}

    def get(op: str, arch: str | None = None):
        arch = arch or device_arch()
        if (op, arch) not in cache:
            target = resolve_target(op, arch)
            project = write_project(target, build_root)
            build_project(project, target)
            cache[op, arch] = (project, load(project))
        return cache[op, arch]

    return get
