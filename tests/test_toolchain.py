"""Without a GPU: nvcc compiles every emitted kernel for its arch with no spills and no local
memory (read from `-Xptxas -v`); the bindings compile and link against a CUDA build of torch,
and `kernels` loads the result (op registration, fake kernels and argument checks all run on
the CPU)."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from kgen.builder import (
    build_project,
    compile_kernel,
    kernel_sources,
    load,
    ops_name,
    parse_ptxas,
    variant_name,
    write_project,
)
from kgen.catalog import arch_names, load_profile, load_spec, op_names
from kgen.project import resolve_target

pytestmark = pytest.mark.toolchain
TARGETS = [resolve_target(op, arch) for op in op_names() for arch in arch_names()]
HOST_ARCH = "sm_90"  # the arch whose build of each op also compiles the host code (gcc's warnings too)


def test_ptxas_report_parser():
    log = """ptxas info    : Compiling entry function '_Z6kernelv' for 'sm_90'
ptxas info    : Function properties for _Z6kernelv
    16 bytes stack frame, 24 bytes spill stores, 40 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 16 bytes cumulative stack size"""
    (entry,) = parse_ptxas(log)
    assert (entry.function, entry.registers, entry.stack_frame, entry.spill_stores, entry.spill_loads) == (
        "_Z6kernelv",
        40,
        16,
        24,
        40,
    )


def test_every_kernel_compiles_without_spills_or_local_memory(tmp_path):
    def compile_one(target):
        """The op's kernels, then its backward's where it has one: (target, [ptxas entries of each .cu]). The
        launchers' host code is compiled for HOST_ARCH only (it differs between archs in constants alone)."""
        project, profile = write_project(target, tmp_path), load_profile(target.arch)
        logs = [
            compile_kernel(
                project,
                target.op,
                profile,
                tmp_path / f"{target.kernel_name}_{i}.o",
                source=source,
                host=target.arch == HOST_ARCH,
            )
            for i, source in enumerate(kernel_sources(project)[profile.compute_capability])
        ]
        for log in logs:
            assert "warning" not in log.lower(), f"{target.kernel_name}: nvcc warnings\n{log[:2000]}"
        return target, [parse_ptxas(log) for log in logs]

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        results = list(pool.map(compile_one, TARGETS))
    for target, (entries, *backward) in results:
        structure = load_spec(target.op).structure
        # sincosf keeps a small buffer for its reduction of huge arguments (Payne-Hanek) in local
        # memory: grid-angle kernels (a rotary backward's too) may have that stack frame, never a spill
        frame = 48 if getattr(structure, "grid", None) else 0
        # A derived backward may spill a register pair: residual AdaLN's 16-bit kernels (four fp32 sums and
        # five row inputs at 128 registers) spill 8 B, measured at 2.3-3.7× torch.compile's backward on the
        # H200 (BENCHMARKS.md); a misplanned partition (220 B: the bf16 kernels sized for fp32) fails.
        for more in backward:
            assert not [e for e in more if e.stack_frame > frame + 16 or e.spill_stores > 16], (
                target.kernel_name,
                [e for e in more if e.spill_stores][:3],
            )
        # one kernel per (dtype, convention, configuration) that the launcher can pick: row_reduce
        # has >= 10 configurations, elementwise 4 (two access widths × 32/64-bit indexing), softmax_loss 4
        # (two access widths × two block sizes)
        per_config = {"row_reduce": 10, "elementwise": 4, "rotary": 2, "softmax_loss": 4}[structure.kind]
        expected = len(structure.conventions) * len(target.dtypes) * per_config
        assert len(entries) >= expected, f"{target.kernel_name}: {len(entries)} kernels"
        bad = [e for e in entries if e.stack_frame > frame or e.spill_stores or e.spill_loads]
        assert not bad, f"{target.kernel_name}: local memory in {bad[:3]}"


@pytest.fixture(scope="module")
def cpu_built(tmp_path_factory):
    root = tmp_path_factory.mktemp("cpu-build")
    from kgen.builder import build_project

    target = resolve_target("rmsnorm", "sm_90")
    project = write_project(target, root)
    build_project(project, target)
    return target, project


def test_build_variant_layout(cpu_built):
    target, project = cpu_built
    variant = project / "build" / variant_name()
    files = sorted(p.name for p in variant.iterdir())
    metadata = json.loads((variant / "metadata.json").read_text())
    lib = f"{metadata['id']}.abi3.so"
    assert files == sorted(["__init__.py", "layers.py", "_ops.py", "metadata.json", "ptxas.log", lib])
    assert metadata["name"] == target.kernel_name and metadata["backend"] == {
        "type": "cuda",
        "archs": ["9.0"],
    }
    assert metadata["id"].startswith(f"_{target.python_name}_cuda_")
    assert f"ops = torch.ops.{metadata['id']}" in (variant / "_ops.py").read_text()


def test_a_build_without_a_step_reports_to_the_log(cpu_built, caplog):
    """Without a `step`, a build says what it does on the kgen.build logger (here: nothing to do)."""
    from kgen.builder import build_project

    target, project = cpu_built
    with caplog.at_level("INFO", logger="kgen.build"):
        build_project(project, target)
    assert [r.getMessage().split(":")[0] for r in caplog.records if r.name == "kgen.build"] == ["up to date"]


def test_loads_through_kernels_on_cpu(cpu_built):
    _, project = cpu_built
    kernel = load(project)
    with pytest.raises(ValueError, match="rmsnorm: x must be a CUDA tensor, got a tensor on cpu"):
        kernel.rmsnorm(torch.randn(2, 8))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():  # the registered fake kernels, as torch.compile uses them
        x = torch.empty(2, 3, 64, device="cuda", dtype=torch.bfloat16)
        w = torch.empty(64, device="cuda", dtype=torch.bfloat16)
        for convention in kernel.CONVENTIONS:
            out = kernel.rmsnorm(x, w, convention=convention)
            assert out.shape == x.shape and out.dtype == x.dtype
        with pytest.raises(Exception, match="weight must have shape"):
            kernel.rmsnorm(x, torch.empty(63, device="cuda", dtype=torch.bfloat16))


def test_fake_kernels_refuse_what_the_binding_refuses(cpu_built):
    """A dtype the build lacks or a param the kernel cannot take fails while torch.compile traces (in the
    fake kernel), with the binding's error, not first when the compiled graph runs on a GPU."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    _, project = cpu_built
    kernel = load(project)
    with FakeTensorMode():
        for dtype in (torch.float64, torch.int32):
            x = torch.empty(2, 64, device="cuda", dtype=dtype)
            with pytest.raises(
                TypeError, match=rf"rmsnorm: x has dtype {dtype}, which this build \(sm_90\) does not"
            ):
                kernel.rmsnorm(x)
        x = torch.empty(2, 64, device="cuda", dtype=torch.bfloat16)
        # the largest double float32 rounds to 0, and the smallest it rounds to inf
        zero, inf = 2.0**-150, 3.4028235677973366e38
        for eps in (-1e-6, 0.0, zero, 1e-300, inf, 1e300, float("nan"), float("inf")):
            with pytest.raises(ValueError, match="rmsnorm: eps must be a finite number > 0 in float32"):
                kernel.rmsnorm(x, eps=eps)
        for eps in (2.0**-149, 3.4028235677973362e38):  # float32's smallest subnormal, its largest number
            assert kernel.rmsnorm(x, eps=eps).shape == x.shape


def test_a_second_copy_of_a_build_loads_and_reuses_its_ops(cpu_built, tmp_path):
    """Another folder holding the same build (same sources and flags, so the same op namespace), loaded
    after the first, reuses the registered ops and fake kernels instead of registering them again (torch
    2.11 raised 'already has a fake impl registered'; newer torch would stack a second registration)."""
    from torch._library.simple_registry import singleton

    target, project = cpu_built
    first = load(project)
    copy = write_project(target, tmp_path)
    variant = build_project(copy, target)
    assert copy != project and variant.name == (project / "build" / variant_name()).name
    second = load(copy)
    assert second is not first and second.ops is first.ops  # one op namespace, the first library's
    qualname = f"{first.ops.name}::rmsnorm"
    assert len(singleton.find(qualname).fake_impl.kernels) == 1
    with pytest.raises(ValueError, match="rmsnorm: x must be a CUDA tensor"):
        second.rmsnorm(torch.randn(2, 8))


def test_the_local_build_is_abi3_clean_and_its_manylinux_gap_is_known(cpu_built):
    """kernel-builder's ABI checker on the local build: no symbol outside Python's stable ABI (abi3, 3.9).
    A local build links against the build machine's C library: its manylinux_2_28 gaps are glibc symbols
    only (here __libc_single_threaded; a newer glibc adds more), never libstdc++'s or Python's, and README
    and CARD say that a Hub library is built by kernel-builder."""
    import kernel_abi_check

    _, project = cpu_built
    (library,) = (project / "build" / variant_name()).glob("*.abi3.so")
    checked = kernel_abi_check.ObjectFile(str(library))
    assert checked.check_python_abi("3.9") == []
    gaps = checked.check_manylinux("manylinux_2_28")
    assert {v.dep for v in gaps} <= {"GLIBC"}, gaps
    assert "built by kernel-builder" in (project / "CARD.md").read_text()


def test_a_project_for_several_archs_builds_and_loads(tmp_path):
    """Each arch's kernels compiled for its own target (with its PTX), the binding once, one library:
    loadable, its metadata listing every capability."""
    from kgen.project import resolve_multi_target

    target = resolve_multi_target("rope3d", ["sm_75", "sm_90"], ["float16"])
    project = write_project(target, tmp_path)
    variant = build_project(project, target)
    metadata = json.loads((variant / "metadata.json").read_text())
    assert metadata["backend"]["archs"] == ["7.5", "9.0"] and metadata["name"] == "rope3d-sm75-sm90"
    log = (variant / "ptxas.log").read_text()
    assert "for 'sm_75'" in log and "for 'sm_90'" in log
    kernel = load(project)
    with pytest.raises(ValueError, match="rope3d: x must be a CUDA tensor"):
        kernel.rope3d(torch.randn(1, 24, 64, dtype=torch.float16), 2, 3, 4)


def test_layers_follow_kernels_rules(cpu_built):
    from kernels.layer.layer import _validate_layer

    _, project = cpu_built
    kernel = load(project)

    class LlamaRMSNorm(torch.nn.Module):  # transformers' forward signature
        def forward(self, hidden_states):
            return hidden_states

    _validate_layer(check_cls=LlamaRMSNorm, cls=kernel.layers.RMSNorm, repo="kgen")


def test_local_kernels_env(cpu_built, monkeypatch):
    import kernels
    import kernels.load as kernels_load

    _, project = cpu_built
    monkeypatch.setenv("LOCAL_KERNELS", f"kgen/rmsnorm-sm90={project}")
    kernels_load._parse_local_kernel_overrides.cache_clear()
    module = kernels.get_kernel("kgen/rmsnorm-sm90", version=1)
    assert hasattr(module, "rmsnorm") and hasattr(module.layers, "RMSNorm")


def test_changed_source_gets_a_new_library(cpu_built, tmp_path):
    """A rebuilt spec never reuses a stale library: the ops name hashes every source."""
    target, project = cpu_built
    flags = ["-O3"]
    before = ops_name(project, target.python_name, flags)
    write_project(target, tmp_path)
    moved = tmp_path / target.kernel_name
    assert ops_name(moved, target.python_name, flags) == before
    cu = moved / "rmsnorm_cuda" / "rmsnorm.cu"
    cu.write_text(cu.read_text() + "\n// changed\n")
    assert ops_name(moved, target.python_name, flags) != before
    assert ops_name(moved, target.python_name, ["-O2"]) != ops_name(moved, target.python_name, flags)


def test_autograd_in_the_binding_on_meta_tensors(cpu_built, tmp_path):
    """The C++ autograd kernels, without a GPU: meta tensors run the fake kernels under them. A derived
    backward (silu_mul) gives each input a gradient of its shape and passes opcheck with inputs that
    require grad; a backward itself has no derivative."""
    from kgen.builder import build_project

    target = resolve_target("silu_mul", "sm_90", ["bfloat16"])
    project = write_project(target, tmp_path)
    build_project(project, target)
    silu_mul = load(project)
    x, up = (torch.randn(4, 40, device="meta", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    for convention in silu_mul.CONVENTIONS:
        out = silu_mul.silu_mul(x, up, convention=convention)
        grads = torch.autograd.grad(out.sum(), [x, up], create_graph=True)
        assert [g.shape for g in grads] == [x.shape, up.shape]
        with pytest.raises(RuntimeError, match="derivative for .*silu_mul_backward.* is not implemented"):
            torch.autograd.grad(grads[0].sum(), [x])
        torch.library.opcheck(
            getattr(silu_mul.ops, load_spec("silu_mul").variant(convention)).default, (x, up)
        )


def test_row_reduction_autograd_with_an_optional_weight_on_meta_tensors(cpu_built):
    """rmsnorm's derived backward (a column reduction): x and the weight get gradients of their shapes, an
    absent weight none (and its input is not saved), opcheck passes either way; the weight's gradient alone
    flows when x needs none."""
    rmsnorm = load(cpu_built[1])
    x = torch.randn(2, 3, 40, device="meta", requires_grad=True)
    w = torch.randn(40, device="meta", requires_grad=True)
    for convention in rmsnorm.CONVENTIONS:
        out = rmsnorm.rmsnorm(x, w, convention=convention)
        assert [g.shape for g in torch.autograd.grad(out.sum(), [x, w])] == [x.shape, w.shape]
        (gx,) = torch.autograd.grad(rmsnorm.rmsnorm(x, None, convention=convention).sum(), [x])
        assert gx.shape == x.shape
        variant = getattr(rmsnorm.ops, load_spec("rmsnorm").variant(convention)).default
        torch.library.opcheck(variant, (x, w, 1e-6))
        torch.library.opcheck(variant, (x, None, 1e-6))
    (gw,) = torch.autograd.grad(rmsnorm.rmsnorm(x.detach(), w).sum(), [w])
    assert gw.shape == w.shape


def test_a_prologue_backward_on_meta_tensors(tmp_path):
    """fused_add_rmsnorm's derived backward (its prologue written out in the inputs): x, residual and the
    weight get gradients of their shapes from both outputs, opcheck passes; the in-place form, which
    overwrites the residual a backward would read, raises on backprop."""
    from kgen.builder import build_project

    target = resolve_target("fused_add_rmsnorm", "sm_90", ["bfloat16"])
    project = write_project(target, tmp_path)
    build_project(project, target)
    fused = load(project)
    x, r = (torch.randn(4, 40, device="meta", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    w = torch.randn(40, device="meta", dtype=torch.bfloat16, requires_grad=True)
    for convention in fused.CONVENTIONS:
        out, residual_out = fused.fused_add_rmsnorm(x, r, w, convention=convention)
        grads = torch.autograd.grad((out + residual_out).sum(), [x, r, w])
        assert [g.shape for g in grads] == [x.shape, r.shape, w.shape]
        variant = getattr(fused.ops, load_spec("fused_add_rmsnorm").variant(convention)).default
        torch.library.opcheck(variant, (x, r, w, 1e-6))
    with pytest.raises(RuntimeError, match="derivative for .*fused_add_rmsnorm_ is not implemented"):
        fused.fused_add_rmsnorm_(x, r.detach().clone(), w).sum().backward()


def test_rotary_autograd_on_meta_tensors(tmp_path):
    """rope's derived backward (a rotation of the gradients): q and k get gradients of their shapes (k with
    fewer heads), opcheck passes with q and k requiring grad; a table that requires grad is refused (it would
    get no gradient), and under no_grad nothing is refused."""
    from kgen.builder import build_project

    target = resolve_target("rope", "sm_90", ["bfloat16"])
    project = write_project(target, tmp_path)
    build_project(project, target)
    rope = load(project)
    q = torch.randn(2, 4, 6, 64, device="meta", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, 2, 6, 64, device="meta", dtype=torch.bfloat16, requires_grad=True)
    cos, sin = (torch.randn(2, 6, 64, device="meta", dtype=torch.bfloat16) for _ in range(2))
    for convention in rope.CONVENTIONS:
        out, k_out = rope.rope(q, k, cos, sin, convention=convention)
        assert [g.shape for g in torch.autograd.grad((out.sum(), k_out.sum()), [q, k])] == [q.shape, k.shape]
        torch.library.opcheck(
            getattr(rope.ops, load_spec("rope").variant(convention)).default, (q, k, cos, sin)
        )
    table = cos.clone().requires_grad_()
    with pytest.raises(
        ValueError, match="rope: cos requires grad, but rope's derived backward gives it no gradient"
    ):
        rope.rope(q, k, table, sin)
    with torch.no_grad():
        assert rope.rope(q, k, table, sin)[0].shape == q.shape


def test_modulation_autograd_on_meta_tensors(tmp_path):
    """residual_adaln_rmsnorm's derived backward: each input's gradient has its shape through the C++
    autograd and the backward's fake kernel (scale and shift per batch, gate per token or absent), and
    opcheck passes with every input requiring grad."""
    from kgen.builder import build_project

    target = resolve_target("residual_adaln_rmsnorm", "sm_90", ["bfloat16"])
    project = write_project(target, tmp_path)
    build_project(project, target)
    op = load(project)
    meta = dict(device="meta", dtype=torch.bfloat16, requires_grad=True)  # the build's dtype
    x, h, gate = (torch.randn(2, 6, 64, **meta) for _ in range(3))
    scale, shift = (torch.randn(2, 1, 64, **meta) for _ in range(2))
    weight = torch.randn(64, **meta)
    for given in ([x, h, scale, shift, gate, weight], [x, h, scale, shift, None, weight]):
        out, residual = op.residual_adaln_rmsnorm(*given)
        leaves = [t for t in given if t is not None]
        grads = torch.autograd.grad((out.sum(), residual.sum()), leaves)
        assert [g.shape for g in grads] == [t.shape for t in leaves]
        for convention in op.CONVENTIONS:
            variant = load_spec("residual_adaln_rmsnorm").variant(convention)
            torch.library.opcheck(getattr(op.ops, variant).default, (*given, 1e-6))


def test_autograd_of_an_op_with_two_outputs_on_meta_tensors(tmp_path, monkeypatch):
    """A derived backward for several outputs (tests/backward_ops/pair_ops.py): the binding's autograd returns
    both, and an output that receives no gradient counts as zeros."""
    from kgen.builder import build_project
    from kgen.catalog import load_spec as loader

    monkeypatch.setenv("KGEN_OPS_PATH", str(Path(__file__).parent / "backward_ops"))
    loader.cache_clear()
    try:
        target = resolve_target("pair_ops", "sm_90", ["bfloat16"])
        project = write_project(target, tmp_path)
        build_project(project, target)
    finally:
        loader.cache_clear()
    pair = load(project)
    x, y = (torch.randn(4, 40, device="meta", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    prod, total = pair.pair_ops(x, y)
    assert [g.shape for g in torch.autograd.grad((prod + total).sum(), [x, y], retain_graph=True)] == [
        x.shape
    ] * 2
    assert [g.shape for g in torch.autograd.grad(prod.sum(), [x, y])] == [x.shape] * 2
    torch.library.opcheck(pair.ops.pair_ops.default, (x, y))
