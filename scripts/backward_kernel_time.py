"""The GPU time of kgen's backward kernels per call, without autograd's host overhead: for each suite shape of
each op, the kgen kernels' durations under torch.profiler (CUPTI), L2 flushed before each call, each kernel's
median over 30 calls, summed, median of 3 rounds; next to a same-size device copy timed with CUDA events. One
JSON line per shape on stdout.

`kgen bench OP --backward` times autograd.grad with CUDA events, whose host overhead (tens of µs per call)
hides the kernels below ~100 µs; this measures the kernels alone, for before/after comparisons of a kernel
change (run it once per checkout, each with its own build root). Usage, on a GPU:

    kgen build rmsnorm adaln_rmsnorm --arch sm_90 --compile --out /tmp/kb
    python scripts/backward_kernel_time.py /tmp/kb rmsnorm,adaln_rmsnorm [--tag after]
"""

import argparse
import json
import statistics
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from kgen.autodiff import gradient_name, gradient_outputs
from kgen.bench import Timer, example_inputs
from kgen.builder import build_op, device_arch, load
from kgen.catalog import backward_spec, load_spec, suite

CALLS = 30  # profiled calls per round


def kernels_us(fn, flush) -> float:
    """One call's kgen kernels: each kernel's median duration over CALLS calls, summed."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            flush.zero_()
            fn()
        torch.cuda.synchronize()
    durations: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type.name == "CUDA" and "kgen" in e.name:
            durations.setdefault(e.name, []).append(e.device_time)
    return sum(statistics.median(v) for v in durations.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("build_root", type=Path)
    parser.add_argument("ops", help="comma-separated op names")
    parser.add_argument("--tag", default="", help="copied into every line (e.g. before / after)")
    args = parser.parse_args()
    timer = Timer(torch, 50)
    for op in args.ops.split(","):
        spec, back = load_spec(op), backward_spec(op)
        kernel = getattr(load(build_op(op, device_arch(), args.build_root)), op)
        gradients = gradient_outputs(spec, back)
        read = {t.name for t in back.inputs}
        for case in suite(op):
            params = case.param_values(spec)
            inputs = example_inputs(
                spec, case.shape, torch.bfloat16, per_batch=case.per_batch, k_heads=case.k_heads
            )
            inputs = [t.requires_grad_(s.name in gradients) for t, s in zip(inputs, spec.inputs)]
            outs = kernel(*inputs, *params)
            outs = outs if isinstance(outs, tuple) else (outs,)
            # the minimum traffic, as kgen bench counts it: the inputs the backward reads and the outputs'
            # gradients read, the inputs' gradients written (a shared gradient once)
            moved = [t for t, s in zip(inputs, spec.inputs) if s.name in read]
            moved += [
                t for t, s in zip(inputs, spec.inputs) if gradients.get(s.name) == gradient_name(s.name)
            ]
            nbytes = sum(t.numel() * t.element_size() for t in [*moved, *outs])
            leaves = [t for t in inputs if t.requires_grad]
            grads = [torch.randn_like(o) for o in outs]
            call = lambda: torch.autograd.grad(outs, leaves, grads, retain_graph=True)  # noqa: E731
            us = statistics.median(kernels_us(call, timer.flush) for _ in range(3))
            copy = statistics.median(timer.copy_us(nbytes) for _ in range(3))
            line = {"tag": args.tag, "op": op, "shape": case.label, "MB": round(nbytes / 1e6, 1)}
            line |= {"us": round(us, 1), "copy_us": round(copy, 1), "pct_copy": round(100 * copy / us)}
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
