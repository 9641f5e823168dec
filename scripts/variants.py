"""Two builds of the same ops timed against each other in one process: each op's forward and derived backward
(called directly, no autograd) at its suite shapes (or only the largest), the two builds interleaved with kgen
bench's timer (CUDA events, L2 flushed, median of 100 runs, 4 interleaved rounds, the order rotated: each
build timed first in two), beside a same-size copy; their outputs compared bitwise (a differing output named,
with its largest difference relative to the base output's largest magnitude). For a planner or template
change measured before it lands: build the ops from each tree (`kgen build OPS --arch sm_90 --compile
--out DIR`), then

python3 scripts/variants.py BASE NEW OP... [--largest] [--forward] [--case SHAPE [NAME=VALUE ...]]

prints a Markdown table (base / new > 1: the new build is faster)."""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("ops", nargs="+")
    parser.add_argument("--largest", action="store_true", help="only each op's largest suite shape")
    parser.add_argument("--forward", action="store_true", help="the forward only, not the derived backward")
    parser.add_argument(
        "--case",
        nargs="+",
        action="append",
        metavar="SHAPE [NAME=VALUE]",
        help="a shape outside the suite with its params, e.g. --case 16x64x2048 frames=1 height=8 width=8 "
        "(repeatable; instead of the suite's)",
    )
    args = parser.parse_args()

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from kgen.bench import Timer, example_inputs
    from kgen.builder import device_arch, load
    from kgen.catalog import backward_spec, load_spec, suite
    from kgen.families.base import Case

    given = [
        Case(
            tuple(int(d) for d in shape.split("x")),
            params=tuple((k, float(v)) for k, v in (p.split("=") for p in params)),
        )
        for shape, *params in args.case or []
    ]

    def differences(spec, base, new) -> str:
        """ "yes" where every output is bitwise the base build's, else each differing output with its largest
        difference relative to the base output's largest magnitude."""

        def relative(a, b) -> float:
            return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30)).item()

        names = [t.name for t in spec.outputs]
        differ = [f"{n} ({relative(a, b):.1e})" for n, a, b in zip(names, new, base) if not torch.equal(a, b)]
        return "yes" if not differ else "no: " + ", ".join(differ)

    def traffic(tensors) -> int:
        return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))

    arch = device_arch().removeprefix("sm_")
    timer = Timer(torch, repeats=100)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, bf16")
    print(
        "| op | pass | shape | MB moved | base µs | new µs | base / new | % of same-size copy (base, new) ",
        end="",
    )
    print("| bitwise |\n|---|---|---|---|---|---|---|---|---|")
    for op in args.ops:
        libs = {
            v: load(root / f"{op.replace('_', '-')}-sm{arch}")
            for v, root in (("base", args.base), ("new", args.new))
        }
        cases = given or suite(op)
        for case in [max(cases, key=lambda c: math.prod(c.shape))] if args.largest else cases:
            for spec in (load_spec(op), None if args.forward else backward_spec(op)):
                if spec is None:
                    continue
                gen = torch.Generator(device="cuda").manual_seed(0)
                inputs = example_inputs(
                    spec,
                    case.shape,
                    torch.bfloat16,
                    per_batch=case.per_batch,
                    k_heads=case.k_heads,
                    generator=gen,
                )
                params = case.param_values(spec)
                ops = {v: getattr(lib._ops.ops, spec.name) for v, lib in libs.items()}
                fns = {v: (lambda f=f: f(*inputs, *params)) for v, f in ops.items()}
                outs = {v: fn() for v, fn in fns.items()}
                as_tuple = {v: o if isinstance(o, (tuple, list)) else (o,) for v, o in outs.items()}
                same = differences(spec, as_tuple["base"], as_tuple["new"])
                moved = traffic(inputs) + traffic(as_tuple["new"])
                med = {v: statistics.median(t) for v, t in timer.rounds_us(fns, 4).items()}
                copy = timer.copy_us(moved)
                direction = "forward" if spec.name == op else "backward"
                print(
                    f"| {op} | {direction} | {case.label} | {moved / 1e6:.1f} | {med['base']:.1f} | "
                    f"{med['new']:.1f} | {med['base'] / med['new']:.2f} | {100 * copy / med['base']:.0f}, "
                    f"{100 * copy / med['new']:.0f} | {same} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
