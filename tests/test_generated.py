"""generated/ is the committed output of `kgen build --all` (reviewers see what a change does to
emitted code); the projects follow the Kernel Hub rules; builds are deterministic and atomic."""

from __future__ import annotations

import ast
import re
import stat
from pathlib import Path

import pytest
import tomllib

import kgen.builder as builder
import kgen.project as project_module
from kgen.builder import render_target, write_project
from kgen.catalog import arch_names, op_names
from kgen.errors import KgenError
from kgen.project import MultiTarget, resolve_multi_target, resolve_target, write_tree

GENERATED = Path(__file__).resolve().parents[1] / "generated"
TARGETS = [resolve_target(op, arch) for op in op_names() for arch in arch_names()]
EVERY_ARCH = [resolve_multi_target(op, ["all"]) for op in op_names()]  # the Hub projects: one per op
KERNEL_NAME = re.compile(r"^[a-z][-a-z0-9]*[a-z0-9]$")  # kernel-builder's general.name rule


def tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "build" not in p.relative_to(root).parts
    }


def test_generated_matches_a_fresh_build(tmp_path):
    for target in TARGETS + EVERY_ARCH:
        write_project(target, tmp_path)
    fresh, committed = tree(tmp_path), tree(GENERATED)
    assert sorted(fresh) == sorted(committed), "run `kgen build --all` and commit generated/"
    stale = [path for path in fresh if fresh[path] != committed[path]]
    assert not stale, f"generated/ is stale in {stale}: run `kgen build --all` and commit it"


def test_byte_identical_twice():
    for target in TARGETS:
        assert render_target(target) == render_target(target)


def test_failed_build_leaves_the_existing_project(tmp_path, monkeypatch):
    target = TARGETS[0]
    project = write_project(target, tmp_path)
    before = tree(project)

    def explode(*_):
        raise RuntimeError("disk full")

    monkeypatch.setattr(builder, "render_project", explode)
    with pytest.raises(RuntimeError):
        write_project(target, tmp_path)
    assert tree(project) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [project.name], "no temporary folders left"


def test_failed_write_cleans_up(tmp_path, monkeypatch):
    files = {"a.txt": "a", "b/c.txt": "c"}
    write_tree(files, tmp_path / "proj")
    monkeypatch.setattr(project_module.os, "replace", lambda *a: (_ for _ in ()).throw(OSError("no")))
    with pytest.raises(OSError):
        write_tree({"new.txt": "n"}, tmp_path / "proj")
    assert tree(tmp_path / "proj") == {"a.txt": b"a", "b/c.txt": b"c"}
    assert [p.name for p in tmp_path.iterdir()] == ["proj"]


@pytest.mark.parametrize("target", TARGETS + EVERY_ARCH, ids=lambda t: t.kernel_name)
def test_hub_rules(target):
    files = render_target(target)
    assert KERNEL_NAME.match(target.kernel_name)
    config = tomllib.loads(files["build.toml"])
    general = config["general"]
    assert general == {
        "name": target.kernel_name,
        "version": 1,
        "edition": 5,
        "license": "apache-2.0",
        "backends": ["cuda"],
    }
    assert set(config["torch"]["src"]) <= set(files)
    parts = target.targets if isinstance(target, MultiTarget) else (target,)
    assert len(config["kernel"]) == len(parts), "one kernel section per arch"
    for kernel, part in zip(config["kernel"].values(), parts):  # each arch's kernels for its own capability
        assert set(kernel) == {"backend", "src", "depends", "cuda-capabilities"}
        assert set(kernel["src"]) <= set(files) and kernel["backend"] == "cuda"
        assert kernel["cuda-capabilities"] == [part.profile.compute_capability]
    pkg = f"torch-ext/{target.python_name}"
    assert f"{pkg}/__init__.py" in files and f"{pkg}/layers.py" in files
    assert not any(p.endswith(("registration.h", "_ops.py")) for p in files), "kernel-builder generates these"
    for path, text in files.items():
        assert "pybind11" not in text and "torch/extension.h" not in text, path
    binding = files["torch-ext/torch_binding.cpp"]
    assert "TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops)" in binding
    assert "REGISTER_EXTENSION(TORCH_EXTENSION_NAME)" in binding
    assert not re.search(r"TORCH_LIBRARY(_IMPL)?\(", binding), "no hard-coded op namespace"
    assert '#include "registration.h"' in binding
    for path in (f"{pkg}/__init__.py", f"{pkg}/layers.py"):
        check_python_rules(files[path], target.python_name)
    assert files["CARD.md"].startswith("---\nlibrary_name: kernels\nlicense: apache-2.0\n---\n")
    assert "kernel-builder.lib.genKernelFlakeOutputs" in files["flake.nix"]


def test_the_card_says_what_the_binding_serves():
    """CARD.md's head sizes of a fused q/k norm are the ones its binding takes in each dtype (lanes_fit: the
    integrations' copy of that check), a rotary op's outputs keep their input's layout, a row op's are
    contiguous."""
    from kgen.integrations._rotary_fit import lanes_fit

    for op, half in (("qk_norm_rope", True), ("qk_norm_rope_flux", False)):
        card = render_target(resolve_target(op, "sm_90"))["CARD.md"]
        for dtype, size in (("float32", 4), ("float16", 2), ("bfloat16", 2)):
            served = [d for d in range(1, 4097) if lanes_fit(d, size, half_pairs=half)]
            assert f"{served[0]} · 2^k up to {served[-1]} in {dtype}" in card, (op, dtype)
    rope, rmsnorm = (render_target(resolve_target(op, "sm_90"))["CARD.md"] for op in ("rope", "rmsnorm"))
    assert "A rotated output keeps its input's layout" in rope and "Outputs are contiguous." not in rope
    assert "Outputs are contiguous." in rmsnorm and "new contiguous tensors" not in rope


def check_python_rules(source: str, python_name: str) -> None:
    tree_ = ast.parse(source)
    for node in ast.walk(tree_):
        if isinstance(node, ast.Import):
            assert all(a.name.split(".")[0] in {"torch", "typing"} for a in node.names), ast.unparse(node)
        if isinstance(node, ast.ImportFrom):
            assert node.level >= 1 or node.module.split(".")[0] in {"torch", "typing"}, ast.unparse(node)
            assert node.module is None or python_name not in node.module, "no absolute self-imports"
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "torch.library.register_fake":
            first = node.args[0]
            assert isinstance(first, ast.Call) and ast.unparse(first.func) == "add_op_namespace_prefix"
        if isinstance(node, ast.ClassDef):  # `kernels` layer rules
            members = {
                n.name if isinstance(n, ast.FunctionDef) else ast.unparse(n.target)
                for n in node.body
                if isinstance(n, (ast.FunctionDef, ast.AnnAssign))
            }
            assert members == {"forward", "can_torch_compile", "has_backward"}, members


def test_concurrent_writers_do_not_corrupt(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    target = TARGETS[0]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: write_project(target, tmp_path), range(16)))
    assert tree(tmp_path / target.kernel_name) == {k: v.encode() for k, v in render_target(target).items()}
    assert [p.name for p in tmp_path.iterdir()] == [target.kernel_name]


def test_folders_get_the_permissions_of_a_plain_mkdir(tmp_path):
    """Projects and their folders are created like `mkdir` would (the umask's), not private to their
    writer."""
    project = write_project(TARGETS[0], tmp_path)
    probe = tmp_path / "probe"
    probe.mkdir()
    expected = stat.S_IMODE(probe.stat().st_mode)
    folders = [project, *(p for p in project.rglob("*") if p.is_dir())]
    assert {stat.S_IMODE(p.stat().st_mode) for p in folders} == {expected}, "a folder is not like `mkdir`'s"


def test_generated_python_has_no_constant_conditions():
    """No `if True:` or other conditions on constants in generated Python (a template choosing, badly)."""
    for target in TARGETS[:: len(arch_names())]:
        for path, text in render_target(target).items():
            if path.endswith(".py"):
                for node in ast.walk(ast.parse(text)):
                    if isinstance(node, (ast.If, ast.IfExp, ast.While)):
                        assert not isinstance(node.test, ast.Constant), (
                            f"{target.kernel_name}/{path}: {ast.unparse(node.test)}"
                        )


def test_the_project_test_reports_and_takes_its_seed(tmp_path, monkeypatch, capsys):
    """The project's own test draws random inputs: each test prints their seed (pytest shows it beside a
    failure) and KGEN_TEST_SEED=<seed> draws the same inputs again; without it every test draws afresh."""
    import importlib.util

    import torch

    path = tmp_path / "test_rmsnorm.py"
    path.write_text(render_target(resolve_target("rmsnorm", "sm_90"))["tests/test_rmsnorm.py"])
    spec = importlib.util.spec_from_file_location("generated_project_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def draw():
        seed = module.seed_inputs()
        return seed, torch.randn(8), capsys.readouterr().out

    monkeypatch.setenv("KGEN_TEST_SEED", "1234")
    (seed, first, said), (_, again, _) = draw(), draw()
    assert seed == 1234 and torch.equal(first, again)
    assert "seed 1234 (KGEN_TEST_SEED=1234 draws them again)" in said
    monkeypatch.delenv("KGEN_TEST_SEED")
    fresh = [draw() for _ in range(4)]
    assert len({seed for seed, _, _ in fresh}) == 4  # 4 draws of 2^31 seeds
    assert all(f"seed {seed} (KGEN_TEST_SEED={seed} " in said for seed, _, said in fresh)


def test_the_plan_is_written_once_per_project():
    """The plan (every configuration and its reason) opens the .cu; the .h points to it instead of
    repeating it (a backward's kernels have their own .cu and .h, with their own plan)."""
    for target in TARGETS[:: len(arch_names())]:
        files = render_target(target)
        plan_line = next(
            line for line in files[f"{target.op}_cuda/{target.op}.cu"].splitlines() if "vector path" in line
        )
        own = [
            f"{target.op}_cuda/{target.op}.cu",
            f"{target.op}_cuda/{target.op}.h",
            "torch-ext/torch_binding.cpp",
        ]
        assert sum(plan_line in files[path] for path in own) == 1
        assert (
            f"The plan and the rule behind each choice: {target.op}.cu."
            in files[f"{target.op}_cuda/{target.op}.h"]
        )


def test_a_project_for_several_archs():
    """One project, each arch's kernels in their own .cu for their own capability, a table of plans newest
    first in the binding, the dtypes of every arch together (sm_75 runs no bfloat16: its bit is clear)."""
    target = resolve_multi_target("rmsnorm", ["sm_90", "sm_75", "sm_80"])
    assert target.kernel_name == "rmsnorm-sm75-sm80-sm90" and target.archs == ["sm_75", "sm_80", "sm_90"]
    files = render_target(target)
    kernels = sorted(p for p in files if p.endswith(".cu"))
    units = ("rmsnorm", "rmsnorm_backward")  # the op and its derived backward, each per arch
    assert kernels == sorted(f"rmsnorm_cuda/{u}_sm_{a}.cu" for u in units for a in (75, 80, 90))
    for path in kernels:
        unit, arch = path.removesuffix(".cu").removeprefix("rmsnorm_cuda/").split("_sm_")
        assert f"cudaError_t launch_{unit}_sm_{arch}(" in files[path]
        assert f"arch: sm_{arch}" in files[path]
    binding = files["torch-ext/torch_binding.cpp"]
    table = binding[binding.index("constexpr Plans kPlans[] = {") :]
    assert (
        table.index('{90, "sm_90", 7u,') < table.index('{80, "sm_80", 7u,') < table.index('{75, "sm_75", 3u,')
    )
    assert "enum class DType { k_float32, k_float16, k_bfloat16 };" in files["rmsnorm_cuda/rmsnorm.h"]
    assert (
        "for sm_75, sm_80, sm_90 (float32, float16, bfloat16)"
        in files["torch-ext/rmsnorm_sm75_sm80_sm90/__init__.py"]
    )
    every = resolve_multi_target("rmsnorm", ["all"])
    assert every.kernel_name == "rmsnorm" and every.archs == arch_names()
    with pytest.raises(KgenError, match="sm_75 runs none of the dtypes asked for"):
        resolve_multi_target("rmsnorm", ["sm_75", "sm_90"], ["bfloat16"])
    with pytest.raises(KgenError, match="needs two or more"):
        resolve_multi_target("rmsnorm", ["sm_90", "sm_90"])
