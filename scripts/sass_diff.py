"""Two trees' kernels compared as machine code, without a GPU: each op rendered from each tree (`kgen build
OP --arch ARCH --out DIR`, no compile), every kernel .cu compiled by nvcc to a cubin (the builder's device
flags, ptxas's registers and spills kept) and listed by cuobjdump; then, per kernel file, the SASS
instructions of all its kernel entries in each tree, their ratio, the opcodes whose counts moved most, and the
entries that spill, use more registers or grew by more than 1 %. Instructions are a proxy for kernels bound
by issue or latency (a derived backward at 2 resident blocks an SM), not for those bound by memory; a static
count, not what a thread executes. For a template or planner change before it reaches a GPU:

python3 scripts/sass_diff.py BASE_TREE NEW_TREE [OP ...] [--arch sm_90] [--jobs 2] [--entries REGEX]

prints a Markdown table (new / base < 1: fewer instructions); no OP: every op; --entries keeps the kernel
entries whose mangled name matches (e.g. `nv_bfloat16` for the bfloat16 kernels)."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# the parts of a mangled name that differ between two renderings of the same kernel (anonymous namespaces)
UNSTABLE = re.compile(r"_GLOBAL__N__[0-9a-f]+_|(?<=_cu_)[0-9a-f]{8}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("ops", nargs="*")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--jobs", type=int, default=2, help="nvcc processes at once")
    parser.add_argument("--entries", type=re.compile, default=re.compile(""), help="mangled-name filter")
    args = parser.parse_args()

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from kgen.builder import (
        DEVICE_FLAGS,
        SASS_FUNCTION,
        SASS_OPCODE,
        _run,
        find_cuobjdump,
        find_nvcc,
        parse_ptxas,
    )

    cuobjdump = find_cuobjdump()
    if cuobjdump is None:
        sys.exit("no cuobjdump: a CUDA toolkit's bin/ on PATH, or the test extras' cuobjdump wheel")
    scratch = tempfile.TemporaryDirectory(prefix="sass-diff-")  # removed at exit
    work = Path(scratch.name)

    def render(tree: Path, name: str) -> dict[str, Path]:
        out = work / name
        which = args.ops or ["--all"]
        cmd = [sys.executable, "-m", "kgen", "build", *which, "--arch", args.arch, "--out", str(out)]
        subprocess.run(cmd, cwd=tree, check=True, capture_output=True)
        return {src.stem: src for src in sorted(out.glob("*/*_cuda/*.cu"))}

    def listing(src: Path) -> tuple[dict[str, Counter], dict[str, tuple[int, int]]]:
        """Each kernel entry's opcode counts, and its registers and spill stores."""
        cubin = src.with_suffix(".cubin")
        flags = [*DEVICE_FLAGS, f"-arch={args.arch}", "-cubin", "-I", str(src.parent)]
        log = _run([find_nvcc(), *flags, str(src), "-o", str(cubin)], f"nvcc {src.name}")
        sass = _run([cuobjdump, "-sass", str(cubin)], f"cuobjdump {cubin.name}")
        bodies = SASS_FUNCTION.split(sass)[1:]
        opcodes = {
            UNSTABLE.sub("", n): Counter(SASS_OPCODE.findall(b))
            for n, b in zip(bodies[::2], bodies[1::2])
            if args.entries.search(n)
        }
        ptxas = {
            UNSTABLE.sub("", e.function): (e.registers, e.spill_stores)
            for e in parse_ptxas(log)
            if args.entries.search(e.function)
        }
        return opcodes, ptxas

    base, new = render(args.base, "base"), render(args.new, "new")
    files = [f for f in base if f in new]
    with ThreadPoolExecutor(args.jobs) as pool:
        results = dict(zip(files, pool.map(lambda f: (listing(base[f]), listing(new[f])), files)))

    print(f"{args.arch}, nvcc {' '.join(DEVICE_FLAGS)}, entries matching {args.entries.pattern!r};")
    print(f"{args.base} (base) against {args.new} (new)\n")
    print(
        "| kernel file | entries | SASS base | SASS new | new / base | opcodes moved most (base → new) "
        "| notes |"
    )
    print("|---|---|---|---|---|---|---|")
    for f, ((ops_b, regs_b), (ops_n, regs_n)) in results.items():
        shared = [k for k in ops_b if k in ops_n]
        total_b, total_n = (sum((ops[k] for k in shared), Counter()) for ops in (ops_b, ops_n))
        moved = sorted(set(total_b) | set(total_n), key=lambda o: -abs(total_n[o] - total_b[o]))[:3]
        moves = ", ".join(f"{o} {total_b[o]} → {total_n[o]}" for o in moved if total_n[o] != total_b[o])
        grew = sum(1 for k in shared if ops_n[k].total() > 1.01 * ops_b[k].total())
        more_regs = sum(1 for k in shared if k in regs_b and k in regs_n and regs_n[k][0] > regs_b[k][0])
        spills = [sum(1 for r in regs.values() if r[1]) for regs in (regs_b, regs_n)]
        notes = [
            f"{grew} entries grew > 1 %" if grew else "",
            f"{more_regs} use more registers" if more_regs else "",
            f"entries spilling: {spills[0]} → {spills[1]}" if any(spills) else "",
            f"{len(ops_b) - len(shared)} entries only in base, {len(ops_n) - len(shared)} only in new"
            if len(shared) != max(len(ops_b), len(ops_n))
            else "",
        ]
        ratio = total_n.total() / max(total_b.total(), 1)
        print(
            f"| {f} | {len(shared)} | {total_b.total()} | {total_n.total()} | {ratio:.3f} | {moves} | "
            f"{'; '.join(n for n in notes if n)} |"
        )


if __name__ == "__main__":
    main()
