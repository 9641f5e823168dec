"""Where the GPU time of a row reduction's backward goes: each kernel of one backward call (autograd.grad on a
retained graph), kgen's and torch.compile's (its first peer compiled per shape, forward + backward), with its
median duration over 30 calls under torch.profiler, L2 flushed before each call. One JSON line per
(implementation, op, shape) on stdout.

python3 breakdown.py BUILD_ROOT rmsnorm,layernorm [--compile-shapes 'layernorm:5376x2048,...']
"""

import argparse
import json
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

from kgen.autodiff import gradient_outputs
from kgen.bench import Timer, example_inputs
from kgen.builder import build_op, device_arch, load
from kgen.catalog import backward_spec, load_spec, suite

CALLS = 30


def kernels(fn, flush) -> dict[str, float]:
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
        if e.device_type.name != "CUDA" or getattr(e, "is_user_annotation", False):
            continue
        if "FillFunctor<unsigned char>" in e.name:
            continue
        durations.setdefault(e.name, []).append(e.device_time)  # full names: two kernels may share 90 chars
    return {k: round(statistics.median(v) * len(v) / CALLS, 2) for k, v in durations.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("build_root")
    parser.add_argument("ops")
    parser.add_argument("--tag", default="", help="copied into every line (e.g. before / after)")
    parser.add_argument("--compile-shapes", default="", help="op:label,... also timed for torch.compile")
    args = parser.parse_args()
    compiled = set(filter(None, args.compile_shapes.split(",")))
    timer = Timer(torch, 30)
    for op in args.ops.split(","):
        spec, back = load_spec(op), backward_spec(op)
        kernel = getattr(load(build_op(op, device_arch(), args.build_root)), op)
        gradients = gradient_outputs(spec, back)
        peer_name, peer = next(iter(spec.peers.items()))
        for case in suite(op):
            params = case.param_values(spec)
            base = example_inputs(
                spec, case.shape, torch.bfloat16, per_batch=case.per_batch, k_heads=case.k_heads
            )
            impls = {"kgen": lambda *a: kernel(*a, *params)}
            label = case.label.replace("×", "x").replace(" ", "_")
            if f"{op}:{label}" in compiled:
                torch._dynamo.reset()
                impls["compile"] = torch.compile(lambda *a: peer(*a, *params), dynamic=False)
            for name, fn in impls.items():
                inputs = [
                    t.detach().clone().requires_grad_(s.name in gradients) if t is not None else t
                    for t, s in zip(base, spec.inputs)
                ]
                outs = fn(*inputs)
                outs = outs if isinstance(outs, tuple) else (outs,)
                leaves = [t for t in inputs if t is not None and t.requires_grad]
                grads = [torch.randn_like(o) for o in outs]
                call = lambda: torch.autograd.grad(outs, leaves, grads, retain_graph=True)  # noqa: E731
                parts = kernels(call, timer.flush)
                line = {
                    "tag": args.tag,
                    "impl": name,
                    "op": op,
                    "shape": case.label,
                    "total_us": round(sum(parts.values()), 1),
                }
                print(json.dumps(line | {"kernels": parts}), flush=True)


if __name__ == "__main__":
    main()
