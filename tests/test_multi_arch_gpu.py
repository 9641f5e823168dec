"""A project for several archs on the GPU: the binding runs the plans of the newest arch the device can
run, with the same results and speed as that arch's own project; an older arch's plans where the newer ones
need a newer device, refusing what those plans lack; and a device older than every arch is refused."""

from __future__ import annotations

import statistics

import pytest
import torch

from kgen.bench import example_inputs
from kgen.builder import build_op, build_project, device_arch, load, write_project
from kgen.catalog import load_spec
from kgen.project import resolve_multi_target

pytestmark = pytest.mark.gpu
OPS = ["rmsnorm", "rope3d"]
PARAMS = {"rmsnorm": [1e-6], "rope3d": [21, 16, 24, *[p.default for p in load_spec("rope3d").params[3:]]]}


def built_multi(op: str, archs: list[str], root):
    target = resolve_multi_target(op, archs)
    project = write_project(target, root)
    build_project(project, target)
    return getattr(load(project), op)


def median_us(fn, repeats: int = 200) -> float:
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    times = []
    for _ in range(repeats):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


@pytest.mark.parametrize("op", OPS)
def test_every_arch_project_runs_the_device_archs_plans(build_root, op):
    """The project for every arch gives this device's own project's results bitwise, as fast (events, L2
    flushed, interleaved rounds: within 3 %)."""
    every = built_multi(op, ["all"], build_root)
    own = getattr(load(build_op(op, device_arch(), build_root)), op)
    spec, gen = load_spec(op), torch.Generator(device="cuda").manual_seed(0)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        inputs = example_inputs(spec, (2, 8064, 2048), dtype, generator=gen)
        assert torch.equal(every(*inputs, *PARAMS[op]), own(*inputs, *PARAMS[op]))
    inputs = example_inputs(spec, (2, 8064, 2048), torch.bfloat16, generator=gen)
    rounds = [
        (median_us(lambda: every(*inputs, *PARAMS[op])), median_us(lambda: own(*inputs, *PARAMS[op])))
        for _ in range(3)
    ]
    every_us, own_us = (statistics.median(r) for r in zip(*rounds))
    assert every_us <= 1.03 * own_us, (
        f"{op}: {every_us:.1f} µs for every arch, {own_us:.1f} µs for {device_arch()}"
    )


def capability() -> int:
    major, minor = torch.cuda.get_device_capability()
    return major * 10 + minor


@pytest.mark.skipif(
    torch.cuda.is_available() and capability() >= 100, reason="an sm_100 device runs sm_100's plans"
)
def test_an_older_archs_plans_run_where_the_newer_need_a_newer_device(build_root):
    """sm_75 and sm_100 plans on an sm_90 device: sm_75's run (through the driver's JIT of their PTX),
    equal to sm_75's own project; its refusal of bfloat16 names the plans."""
    both = built_multi("rmsnorm", ["sm_75", "sm_100"], build_root)
    t4 = load(build_op("rmsnorm", "sm_75", build_root)).rmsnorm
    x = torch.randn(64, 4096, device="cuda", dtype=torch.float16)
    w = torch.randn(4096, device="cuda", dtype=torch.float16)
    assert torch.equal(both(x, w), t4(x, w))
    with pytest.raises(
        TypeError,
        match=r"rmsnorm: x has dtype BFloat16, which this build's plans for cuda:0 "
        r"\(sm_75\) do not support",
    ):
        both(x.bfloat16(), w.bfloat16())


def test_a_device_older_than_every_arch_is_refused(build_root):
    newer = built_multi("rmsnorm", ["sm_100", "sm_120"], build_root)
    x = torch.randn(8, 64, device="cuda")
    with pytest.raises(
        RuntimeError,
        match=r"rmsnorm: this build targets sm_100 and newer archs but cuda:0 "
        r"is sm_90",
    ):
        newer(x, None)
