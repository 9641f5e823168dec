"""Build & load: writes a target's project (plans, rendering, the files on disk), compiles it with nvcc and
the host compiler into the build variant kernel-builder would produce (build/<variant>/ with __init__.py,
_ops.py, metadata.json and <ops name>.abi3.so), and loads it through `kernels`. No Nix, CMake or
kernel-builder needed."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import re
import shutil
import subprocess
import sysconfig
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import tomllib

from .catalog import arch_names, load_profile
from .errors import BuildError
from .families import family_of
from .planner import plan_kernel
from .profile import ArchProfile
from .project import MultiTarget, Target, resolve_target, write_tree
from .render import render_local_files, render_project

# Where a build says what it does (compiling, linking, up to date) when its caller passes no `step`: a first
# build takes up to a minute an op, shown with logging.basicConfig(level="INFO") or step=print.
PROGRESS = logging.getLogger("kgen.build")
CXX = os.environ.get("CXX", "c++")


def find_nvcc() -> str:
    for candidate in (
        os.environ.get("NVCC"),
        shutil.which("nvcc"),
        str(Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc"),
    ):
        if candidate and Path(candidate).is_file():
            return candidate
    raise BuildError("nvcc not found: put the CUDA toolkit's bin/ on PATH, or set NVCC or CUDA_HOME")


def find_cuobjdump() -> str | None:
    """cuobjdump on PATH, else the one NVIDIA's nvidia-cuda-cuobjdump wheel (the test extras) installs, told
    where the nvidia-cuda-nvdisasm wheel's nvdisasm is (beside it; cuobjdump -sass runs it)."""
    if found := shutil.which("cuobjdump"):
        return found
    try:
        import nvidia  # the namespace package of NVIDIA's CUDA wheels
    except ImportError:
        return None
    wheel = next((p for root in nvidia.__path__ for p in Path(root).glob("cu*/bin/cuobjdump")), None)
    if wheel is None or not (wheel.parent / "nvdisasm").is_file():
        return None
    os.environ.setdefault("NVDISASM_PATH", str(wheel.parent))
    return str(wheel)


# A `cuobjdump -sass` listing: each kernel entry's header, and each instruction's opcode, past its predicate.
SASS_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)", re.M)
SASS_OPCODE = re.compile(
    r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P[T\d]+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)", re.M
)


def cuda_home(nvcc: str) -> Path:
    if os.environ.get("CUDA_HOME"):
        return Path(os.environ["CUDA_HOME"])
    real = Path(nvcc).resolve()
    if real.parent.name == "bin" and (real.parent.parent / "include" / "cuda_runtime.h").is_file():
        return real.parent.parent
    return Path("/usr/local/cuda")


def gencode(profile: ArchProfile) -> list[str]:
    """Machine code for the profile's arch plus its PTX, so newer GPUs can JIT it."""
    cc = profile.capability_number
    return [f"-gencode=arch=compute_{cc},code=[sm_{cc},compute_{cc}]"]


DEVICE_FLAGS = ["-std=c++17", "-O3", "--expt-relaxed-constexpr", "-Xptxas", "-v"]
NVCC_FLAGS = [*DEVICE_FLAGS, "-Xcompiler", "-fPIC"]


def _run(cmd: list[str], what: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(
            f"{what} failed (exit {proc.returncode}):\n$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}"
        )
    return proc.stdout + proc.stderr


@dataclass(frozen=True)
class PtxasEntry:
    function: str
    registers: int
    stack_frame: int
    spill_stores: int
    spill_loads: int


def parse_ptxas(log: str) -> list[PtxasEntry]:
    """The per-kernel lines of `-Xptxas -v`: registers, stack frame and spills."""
    entries, name, frame = [], None, None
    for line in log.splitlines():
        if m := re.search(r"Compiling entry function '([^']+)'", line):
            name = m.group(1)
        elif m := re.search(
            r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line
        ):
            frame = tuple(int(g) for g in m.groups())
        elif (m := re.search(r"Used (\d+) registers", line)) and name and frame:
            entries.append(PtxasEntry(name, int(m.group(1)), *frame))
            name, frame = None, None
    return entries


def compile_kernel(
    project: Path,
    op: str,
    profile: ArchProfile,
    obj: Path,
    nvcc: str | None = None,
    source: str | None = None,
    host: bool = True,
) -> str:
    """nvcc -c of the project's kernel (``source``: one arch's, in a project for several) for the profile's
    arch; returns the ptxas report. Without ``host``, the device code alone (-cubin: the launchers' host
    compile skipped, about a third of the time), for checks that read only the ptxas report."""
    nvcc = nvcc or find_nvcc()
    src = project / (source or f"{op}_cuda/{op}.cu")
    if not host:
        target = [f"-arch=sm_{profile.capability_number}", "-cubin"]
        return _run([nvcc, *DEVICE_FLAGS, *target, str(src), "-o", str(obj)], f"nvcc -cubin {src.name}")
    return _run([nvcc, *NVCC_FLAGS, *gencode(profile), "-c", str(src), "-o", str(obj)], f"nvcc {src.name}")


def kernel_sources(project: Path) -> dict[str, list[str]]:
    """The kernels of a written project, as its build.toml lists them: compute capability -> its .cu files
    (the op's, then its backward's)."""
    sections = tomllib.loads((project / "build.toml").read_text())["kernel"].values()
    return {
        capability: [src for src in section["src"] if src.endswith(".cu")]
        for section in sections
        for capability in section["cuda-capabilities"]
    }


def _torch_env():
    try:
        import torch
    except ImportError as err:  # pragma: no cover - torch is a dependency
        raise BuildError("building needs torch") from err
    root = Path(torch.__file__).parent
    if torch.version.cuda is None or not (root / "include/c10/cuda/impl/cuda_cmake_macros.h").is_file():
        raise BuildError(
            f"torch {torch.__version__} is not a CUDA build (no CUDA headers); the bindings "
            "need one, e.g. `pip install torch==2.14.1` (cu130)"
        )
    return torch, root


def variant_name() -> str:
    """kernel-builder's variant directory name for this torch, e.g. torch211-cxx11-cu130-x86_64-linux."""
    torch, _ = _torch_env()
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    cuda = torch.version.cuda.replace(".", "")
    abi = "-cxx11" if torch.compiled_with_cxx11_abi() else "-cxx98"
    return f"torch{major}{minor}{abi}-cu{cuda}-{platform.machine()}-{platform.system().lower()}"


def _sources(project: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(project)): p.read_bytes()
        for p in sorted(project.rglob("*"))
        if p.is_file() and "build" not in p.relative_to(project).parts and "__pycache__" not in p.parts
    }


def ops_name(project: Path, python_name: str, flags: list[str]) -> str:
    """_<python name>_cuda_<content hash>: a changed source or flag gives a new op namespace and
    library name, so a rebuilt spec never reuses a stale library."""
    digest = hashlib.sha256()
    for rel, data in _sources(project).items():
        digest.update(rel.encode() + b"\0" + data + b"\0")
    digest.update(" ".join(flags).encode())
    return f"_{python_name}_cuda_{digest.hexdigest()[:10]}"


def _parts(target: Target | MultiTarget) -> tuple[Target, ...]:
    return target.targets if isinstance(target, MultiTarget) else (target,)


def render_target(target: Target | MultiTarget) -> dict[str, str]:
    """The target's project files (path -> text): the op and its backward (where its family derives one),
    every arch's dtypes planned for each, then rendered."""
    backward = family_of(target.spec).backward(target.spec)
    units = [
        (
            spec,
            [
                (t.profile, [plan_kernel(spec, t.profile, dtype, t.tuning) for dtype in t.dtypes])
                for t in _parts(target)
            ],
        )
        for spec in [target.spec] + ([backward] if backward else [])
    ]
    return render_project(units, target.spec_hash, target.kernel_name)


def write_project(target: Target | MultiTarget, out_root: Path) -> Path:
    """Writes the target's project to out_root/<kernel name>/ (atomically, keeping a previous build/)."""
    out_dir = Path(out_root) / target.kernel_name
    write_tree(render_target(target), out_dir, keep=("build",))
    return out_dir


def build_project(
    project: Path, target: Target | MultiTarget, step: Callable[[str], None] = PROGRESS.info
) -> Path:
    """Compiles and links the target's project into project/build/<variant>/ (replaced atomically): each
    arch's kernels for its own target (and its PTX, for newer devices), the binding once."""
    op, python_name, kernel_name, parts = target.op, target.python_name, target.kernel_name, _parts(target)
    listed = kernel_sources(project)
    sources = [(t.profile, src) for t in parts for src in listed[t.profile.compute_capability]]
    torch, torch_root = _torch_env()
    nvcc = find_nvcc()
    home = cuda_home(nvcc)
    major, minor = (int(v) for v in torch.__version__.split("+")[0].split(".")[:2])
    cxx_std = "-std=c++20" if (major, minor) >= (2, 12) else "-std=c++17"  # as kernel-builder
    abi = int(torch.compiled_with_cxx11_abi())
    variant = variant_name()
    flags = [*NVCC_FLAGS, *(f for t in parts for f in gencode(t.profile)), cxx_std, variant]
    name = ops_name(project, python_name, flags)
    out = project / "build" / variant
    if (out / f"{name}.abi3.so").is_file():
        step(f"up to date: {out}")
        return out

    with tempfile.TemporaryDirectory(prefix="kgen-build-") as tmp:
        tmp = Path(tmp)
        for rel, text in render_local_files(name).items():
            (tmp / rel).write_text(text)
        includes = [
            tmp,
            torch_root / "include",
            torch_root / "include/torch/csrc/api/include",
            home / "include",
            Path(sysconfig.get_paths()["include"]),
        ]
        binding_cmd = [
            CXX,
            cxx_std,
            "-O2",
            "-fPIC",
            "-c",
            str(project / "torch-ext/torch_binding.cpp"),
            "-o",
            str(tmp / "torch_binding.o"),
            f"-DTORCH_EXTENSION_NAME={name}",
            "-DPy_LIMITED_API=0x03090000",
            "-DCUDA_KERNEL",
            "-DUSE_CUDA=1",
            f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            *[f"-I{p}" for p in includes],
        ]
        archs = ", ".join(t.arch for t in parts)
        step(f"compiling {op}'s kernels for {archs} and the torch binding (torch {torch.__version__})")
        objects = [tmp / f"{op}_{i}.o" for i in range(len(sources))]
        with ThreadPoolExecutor(max_workers=max(2, min(len(sources) + 1, os.cpu_count() or 2))) as pool:
            kernels = [
                pool.submit(compile_kernel, project, op, profile, obj, nvcc, source)
                for (profile, source), obj in zip(sources, objects)
            ]
            binding = pool.submit(_run, binding_cmd, "compiling torch_binding.cpp")
            ptxas_log = "".join(kernel.result() for kernel in kernels)
            binding.result()
        step("linking")
        lib = f"{name}.abi3.so"
        _run(
            [
                CXX,
                "-shared",
                "-o",
                str(tmp / lib),
                *map(str, objects),
                str(tmp / "torch_binding.o"),
                f"-L{torch_root / 'lib'}",
                "-lc10",
                "-lc10_cuda",
                "-ltorch",
                "-ltorch_cpu",
                "-ltorch_cuda",
                f"-L{home / 'lib64'}",
                "-lcudart",
            ],
            "linking",
        )

        package = project / "torch-ext" / python_name
        files = {p.name: p.read_text() for p in sorted(package.glob("*.py"))}
        files["_ops.py"] = (tmp / "_ops.py").read_text()
        files["metadata.json"] = (
            json.dumps(
                {
                    "id": name,
                    "name": kernel_name,
                    "version": 1,
                    "license": "apache-2.0",
                    "python-depends": [],
                    "kernel-depends": [],
                    "backend": {"type": "cuda", "archs": [t.profile.compute_capability for t in parts]},
                },
                indent=2,
            )
            + "\n"
        )
        files["ptxas.log"] = ptxas_log
        files[lib] = (tmp / lib).read_bytes()
        write_tree(files, out)
    return out


def build_op(op: str, arch: str, root: Path, step: Callable[[str], None] = PROGRESS.info) -> Path:
    """root/<op>-<arch>: written, then compiled for this torch (nothing to do where it is up to date)."""
    target = resolve_target(op, arch)
    project = write_project(target, root)
    build_project(project, target, step)
    return project


def device_arch() -> str:
    """The newest arch profile the current CUDA device can run (sm_90 on an H100 or H200)."""
    import torch

    major, minor = torch.cuda.get_device_capability()
    usable = [a for a in arch_names() if load_profile(a).capability_number <= major * 10 + minor]
    if not usable:
        raise BuildError(f"no arch profile runs on this sm_{major}{minor} GPU")
    return max(usable, key=lambda a: load_profile(a).capability_number)


def load(project: Path):
    """Loads a built project through `kernels`, as a user would."""
    from kernels import get_local_kernel

    return get_local_kernel(Path(project))
