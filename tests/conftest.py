"""Shared fixtures. GPU tests (marker `gpu`) skip where there is no CUDA device; toolchain tests (marker
`toolchain`) skip without nvcc or a CUDA build of torch, unless KGEN_REQUIRE_TOOLCHAIN=1 (CI sets it) turns
the skip into a failure.

The GPU tests run the plans of the arch in $KGEN_TEST_ARCH (default: the device's newest): an older arch's
build runs on a newer GPU through the driver's JIT of its PTX, so every arch's plans run on the GPU at
hand. A test parametrized by a dtype that arch refuses (bf16 on sm_75) skips; the property and opcheck
tests check the refusal instead."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from kgen.builder import build_op, device_arch, load, variant_name
from kgen.catalog import load_profile

# what a build says when its arch has no arithmetic for the dtype
REFUSAL = r"which this build \(sm_\d+\) does not support"


def test_arch() -> str:
    """The arch whose plans the GPU tests build and run."""
    return os.environ.get("KGEN_TEST_ARCH") or device_arch()


def refused(dtype: torch.dtype) -> bool:
    """Whether the tested arch has no arithmetic for this dtype (its build refuses it)."""
    return str(dtype).removeprefix("torch.") not in load_profile(test_arch()).dtypes


def usable_dtype() -> torch.dtype:
    """bfloat16 where the tested arch has it, else float16: for tests about something else than dtypes."""
    return torch.float16 if refused(torch.bfloat16) else torch.bfloat16


test_arch.__test__ = False  # a helper, not a test


def fit_axis_dims(spec, hidden: int, params: list) -> list:
    """``params`` with the axis widths of a rotary op's "blocks" grid (Flux's, Wan's) splitting a head of
    ``hidden`` channels as Wan splits it: 2·(hidden // 6) for each of the last two axes, the rest for the
    first. Other ops' params unchanged."""
    grid = getattr(spec.structure, "grid", None)
    if grid is None or grid.layout != "blocks":
        return params
    rest = 2 * (hidden // 6)
    widths = dict(zip(grid.axis_dims, (hidden - 2 * rest, rest, rest)))
    return [widths.get(p.name, v) for p, v in zip(spec.params, params)]


def assert_grads_close(got: dict, eager: dict, truth: dict) -> None:
    """A patched model's parameter gradients (``got``) as close to the fp32 model's (``truth``) as the
    library's own in bf16 (``eager``): relative error at most 1.5× its (+ 1e-3), largest error at most 4× its
    (+ 1e-3 of the largest gradient); finite everywhere."""
    for name, want in truth.items():
        assert torch.isfinite(got[name]).all(), name
        eager_rel, kgen_rel = (
            (g - want).norm().item() / max(want.norm().item(), 1e-30) for g in (eager[name], got[name])
        )
        eager_err, kgen_err = (eager[name] - want).abs().max().item(), (got[name] - want).abs().max().item()
        assert (
            kgen_rel <= 1.5 * eager_rel + 1e-3 and kgen_err <= 4 * eager_err + 1e-3 * want.abs().max().item()
        ), (
            f"{name}: kgen {kgen_rel:.4g} ({kgen_err:.4g}) vs the library {eager_rel:.4g} ({eager_err:.4g}) "
            "from fp32"
        )


REQUIRE_TOOLCHAIN = os.environ.get("KGEN_REQUIRE_TOOLCHAIN") == "1"


def toolchain_missing() -> str | None:
    if shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").is_file():
        return "nvcc not found"
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is not a CUDA build"
    return None


def pytest_collection_modifyitems(config, items):
    missing = toolchain_missing()
    gpu = torch.cuda.is_available()
    for item in items:
        if "gpu" in item.keywords and not gpu:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
        dtype = getattr(getattr(item, "callspec", None), "params", {}).get("dtype")
        if "gpu" in item.keywords and gpu and isinstance(dtype, torch.dtype) and refused(dtype):
            item.add_marker(
                pytest.mark.skip(
                    reason=f"{test_arch()} has no {dtype} (the property and opcheck tests check the refusal)"
                )
            )
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
        arch = arch or test_arch()
        if (op, arch) not in cache:
            project = build_op(op, arch, build_root)
            cache[op, arch] = (project, load(project))
        return cache[op, arch]

    return get


@pytest.fixture(scope="module")
def reference_kernels(build_root):
    """reference_kernels(ops) -> {op name in its library: calls}: on a machine without a GPU, builds each
    op for sm_90 and gives each of its ops (one per convention) a CPU kernel computed by the spec's
    reference in the input dtype, so a model integration runs end to end on real libraries; and lets
    `kernels` pick the sm_90 mapping. The C++ CPU kernels (which refuse CPU tensors) come back at the
    module's end."""
    import inspect
    from collections import Counter

    import kernels.layer.repos

    from kgen.catalog import load_spec
    from kgen.families import family_of

    calls, libraries, patch = Counter(), [], pytest.MonkeyPatch()

    def register(ops):
        patch.setattr(kernels.layer.repos, "_find_capability", lambda: 90)
        for op in ops:
            project = build_op(op, "sm_90", build_root)
            load(project)  # registers the library's ops, named by its metadata's id
            name = json.loads((project / "build" / variant_name() / "metadata.json").read_text())["id"]
            namespace = getattr(torch.ops, name)
            library = torch.library.Library(name, "IMPL")
            libraries.append(library)
            spec = load_spec(op)
            takes_convention = "convention" in inspect.signature(spec.reference).parameters
            for convention in spec.structure.conventions:
                name = spec.variant(convention.name)

                def cpu(
                    *args,
                    name=name,
                    convention=convention.name,
                    reference=spec.reference,
                    ops=namespace,
                    takes_convention=takes_convention,  # bound now: a later op's must not leak in
                ):
                    calls[name] += 1
                    out = reference(*args, **({"convention": convention} if takes_convention else {}))
                    # each output in the layout the op's fake kernel gives (the binding allocates the same)
                    meta = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
                    fake = getattr(ops, name)(*meta)
                    pairs = zip(out, fake) if isinstance(out, tuple) else [(out, fake)]
                    outs = tuple(
                        torch.empty_strided(f.shape, f.stride(), dtype=f.dtype).copy_(o) for o, f in pairs
                    )
                    return outs if isinstance(out, tuple) else outs[0]

                library.impl(name, cpu, "CPU")
                if (back := family_of(spec).backward(spec)) is not None:
                    library.impl(back.variant(convention.name), backward(back, convention.name), "CPU")
        return calls

    def backward(back, convention):
        """The derived backward's CPU kernel: its family's CPU evaluation of the derived math (float64, the
        roundings to the dtype included), each gradient in its input's dtype (empty for an absent input)."""
        name, family, n = back.variant(convention), family_of(back), len(back.inputs)

        def cpu(*args):
            calls[name] += 1
            grads = family.evaluate(back, list(args[:n]), list(args[n:]), convention)
            given = dict(zip((t.name for t in back.inputs), args))
            out = tuple(  # one per output: grad_<input>, empty for an absent input (a rotation's: none)
                g.to(args[0].dtype)
                if given.get(t.name.removeprefix("grad_"), args[0]) is not None
                else args[0].new_empty(0)
                for t, g in zip(back.outputs, grads)
            )
            return out if len(out) > 1 else out[0]

        return cpu

    yield register
    for library in libraries:
        library._destroy()
    patch.undo()
