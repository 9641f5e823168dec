"""Without a GPU: the hot kernels' machine code for sm_90 moves 16 bytes per global access on the
vector path and uses no local memory. Two sources of evidence, each kernel entry checked apart:
the PTX (`nvcc -ptx`, everywhere nvcc is) and, where cuobjdump is on PATH or installed by the test extras'
wheel (CI), the SASS of the compiled object (`cuobjdump -sass`). Which entries are the vector path is read
from the emitted .cu: the kernel template's ELEMS × sizeof(T) is 16 bytes there (and its VEC, where it
has one, is true); the scalar
fallbacks legitimately access one element at a time. Spills and stack frames of every kernel are
test_toolchain's; here a stack frame only tells sincosf's buffer from other local memory."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from kgen.builder import (
    NVCC_FLAGS,
    SASS_FUNCTION,
    SASS_OPCODE,
    _run,
    compile_kernel,
    find_cuobjdump,
    find_nvcc,
    gencode,
    parse_ptxas,
    write_project,
)
from kgen.catalog import load_profile, load_spec, op_names
from kgen.families import family_of
from kgen.project import resolve_target

ARCH = "sm_90"
HOT_OPS = op_names()  # every op: each is the hot kernel of someone's model
C_TYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16"}
ELEM_BYTES = {"float": 4, "__half": 2, "__nv_bfloat16": 2}
# sincosf reduces huge arguments (Payne-Hanek) through 7 words in local memory; ptxas rounds that
# to a 32-byte frame. Kernels that compute angles (a spec with a grid) may keep that buffer.
PAYNE_HANEK_BYTES, PAYNE_HANEK_FRAME = 28, 32
# float64 sin/cos (grids whose angles are float64, as the library's tables) reduce through 64-bit words: a
# 40-byte frame (ptxas, nvcc 13.0: rope_flux, rope_wan)
PAYNE_HANEK_FRAME_FP64 = 40

# ---------------------------------------------------------------------------------------------
# Parsers: kernel templates of the .cu, functions of a PTX or SASS listing, their memory accesses.
# ---------------------------------------------------------------------------------------------
KERNEL_TEMPLATE = re.compile(
    r"template <([^>]*)>\s*(?://[^\n]*\s*)*__global__\s+void\s+"
    r"(?:__launch_bounds__\((?:[^()]|\([^()]*\))*\)\s*)?(\w+)\s*\("
)
PTX_FUNCTION = re.compile(r"^(?:\.visible\s+|\.weak\s+)?\.(entry|func)\s+(?:\([^)]*\)\s*)?([\w$]+)", re.M)
PTX_GLOBAL = re.compile(r"^\s*(?:@!?%\w+\s+)?(ld|st)\.global((?:\.[\w:]+)*)\s", re.M)
PTX_LOCAL = re.compile(r"^\s*(?:@!?%\w+\s+)?((?:ld|st)\.local[\w.:]*)", re.M)
PTX_DEPOT = re.compile(r"^\s*\.local\b[^;\[]*\[(\d+)\]", re.M)
SASS_WIDTHS = {"128": 16, "64": 8, "U16": 2, "S16": 2, "U8": 1, "S8": 1}  # bytes by width suffix


def kernel_templates(source: str) -> dict[str, list[str]]:
    """Each __global__ template of a .cu: its name and template parameter names, in order."""
    return {
        m.group(2): [p.split()[-1] for p in m.group(1).split(",")] for m in KERNEL_TEMPLATE.finditer(source)
    }


def template_args(demangled: str, kernel: str) -> list[str] | None:
    """The top-level template arguments of `kernel<...>` in a demangled name."""
    m = re.search(rf"\b{kernel}<", demangled)
    if not m:
        return None
    args, depth, start = [], 0, m.end()
    for i in range(m.end(), len(demangled)):
        c = demangled[i]
        if c in "<(":
            depth += 1
        elif c in ">)" and depth:
            depth -= 1
        elif c in ",>" and depth == 0:
            args.append(demangled[start:i].strip())
            start = i + 1
            if c == ">":
                return args
    return None


def split_functions(listing: str, pattern: re.Pattern, entries_only: bool = False) -> dict[str, str]:
    """Function name -> its text, from one function header to the next."""
    heads = list(pattern.finditer(listing))
    return {
        m.group(m.lastindex): listing[m.start() : nxt.start() if nxt else len(listing)]
        for m, nxt in zip(heads, heads[1:] + [None])
        if not entries_only or m.group(1) == "entry"
    }


@dataclass
class Accesses:
    """One function's global loads and stores by width (bytes -> count) and its local memory."""

    loads: dict[int, int]
    stores: dict[int, int]
    local: list[str]  # local-memory instructions (PTX: and depot declarations)
    local_bytes: int = 0  # PTX: the local depot; SASS: ptxas' stack frame
    payne_hanek: bool = False  # references sincosf's reduction table (PTX only)

    def wide(self, kind: str) -> int:
        return sum(n for width, n in getattr(self, kind).items() if width >= 16)

    def summary(self) -> str:
        def fmt(d):
            return ", ".join(f"{n}×{w}B" for w, n in sorted(d.items())) or "none"

        return f"loads {fmt(self.loads)}; stores {fmt(self.stores)}; local {len(self.local)}"


def ptx_accesses(body: str) -> Accesses:
    loads, stores = {}, {}
    for op, quals in PTX_GLOBAL.findall(body):
        parts = quals.split(".")
        vec = next((int(q[1:]) for q in parts if re.fullmatch(r"v\d+", q)), 1)
        bits = next(int(q[1:]) for q in reversed(parts) if re.fullmatch(r"[bsuf]\d+", q))
        counts = loads if op == "ld" else stores
        counts[vec * bits // 8] = counts.get(vec * bits // 8, 0) + 1
    depots = [int(n) for n in PTX_DEPOT.findall(body)]
    local = [f".local [{n}]" for n in depots] + PTX_LOCAL.findall(body)
    return Accesses(loads, stores, local, sum(depots), "__cudart_i2opi_f" in body)


def sass_accesses(body: str, stack_frame: int = 0) -> Accesses:
    loads, stores, local = {}, {}, []
    for opcode in SASS_OPCODE.findall(body):
        base, *mods = opcode.split(".")
        if base in ("LDG", "STG"):
            counts = loads if base == "LDG" else stores
            width = next((SASS_WIDTHS[m] for m in mods if m in SASS_WIDTHS), 4)  # LDG.E: 32 bits
            counts[width] = counts.get(width, 0) + 1
        elif base in ("LDL", "STL"):
            local.append(opcode)
    return Accesses(loads, stores, local, stack_frame)


def demangle(names: list[str]) -> dict[str, str]:
    tool = shutil.which("c++filt") or shutil.which("cu++filt")
    assert tool, "c++filt (binutils) or cu++filt (CUDA) is needed to read kernel names"
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    return dict(zip(names, out.splitlines()))


@dataclass
class Kernel:
    name: str  # kernel<template arguments>, namespaces left out
    dtype: str  # the C type of T
    vector: bool  # ELEMS × sizeof(T) == 16
    accesses: Accesses


def classify(
    source: str, functions: dict[str, Accesses], names: dict[str, str] | None = None
) -> list[Kernel]:
    """Each function of a listing as a kernel of the .cu's templates: its T, and whether its
    ELEMS elements per access make the 16-byte vector path. names: mangled -> demangled."""
    templates, kernels = kernel_templates(source), []
    assert templates, "no __global__ kernel template found in the .cu"
    for mangled, name in (names or demangle(list(functions))).items():
        found = [
            (kernel, params, args)
            for kernel, params in templates.items()
            if (args := template_args(name, kernel)) and len(args) == len(params)
        ]
        assert len(found) == 1, f"{name}: not one instantiation of {sorted(templates)}"
        kernel, params, args = found[0]
        values = dict(zip(params, args))
        dtype = values["T"]
        assert dtype in ELEM_BYTES, f"{name}: unknown element type {dtype}"
        short = re.sub(r"\w+::\(anonymous namespace\)::|\bkgen_\w+::", "", f"{kernel}<{', '.join(args)}>")
        # a VEC template parameter, where the kernel has one, says whether ELEMS are one access or one each
        vector = int(values["ELEMS"]) * ELEM_BYTES[dtype] == 16 and values.get("VEC", "true") == "true"
        kernels.append(Kernel(short, dtype, vector, functions[mangled]))
    return kernels


# ---------------------------------------------------------------------------------------------
# The checks, on one op's kernels; each message names the evidence, kernel and instruction.
# ---------------------------------------------------------------------------------------------
def vector_access_problems(kernels: list[Kernel], evidence: str, row_writers=()) -> list[str]:
    """Every vector kernel loads and stores 16 bytes at a time; one of ``row_writers`` (kernel name
    prefixes) writes one value per row (a loss), which it stores as it is."""
    need = {"PTX": ("ld.global.v4 (16 B)", "st.global.v4 (16 B)"), "SASS": ("LDG.E.128", "STG.E.128")}[
        evidence
    ]
    problems = []
    for k in (k for k in kernels if k.vector):
        for kind, instruction in zip(("loads", "stores"), need):
            if kind == "stores" and k.name.startswith(tuple(row_writers)):
                continue
            if not k.accesses.wide(kind):
                problems.append(f"{evidence}: {k.name}: no {instruction} ({k.accesses.summary()})")
    return problems


def local_memory_problems(
    kernels: list[Kernel], evidence: str, angles: bool, frame: int = PAYNE_HANEK_FRAME
) -> list[str]:
    """No local memory, but for sin/cos's Payne-Hanek buffer in kernels that compute angles (a stack frame of
    up to ``frame`` bytes in SASS)."""
    problems = []
    for k in kernels:
        a = k.accesses
        sincos_buffer = angles and (
            a.payne_hanek and a.local_bytes <= PAYNE_HANEK_BYTES
            if evidence == "PTX"
            else a.local_bytes <= frame
        )
        if not a.local or sincos_buffer:
            continue
        size = f"{a.local_bytes} B {'depot' if evidence == 'PTX' else 'stack frame'}"
        problems.append(f"{evidence}: {k.name}: local memory ({size}): {sorted(set(a.local))}")
    return problems


# ---------------------------------------------------------------------------------------------
# Parser tests on literal listings: a vector kernel that passes, one that fails, a scalar one.
# ---------------------------------------------------------------------------------------------
CU = """template <typename T, typename Fn, int ELEMS, typename Index>
// a comment between the template and the kernel
__global__ void __launch_bounds__(kBlockThreads * 2, 1)
op_fwd_kernel(const T* __restrict__ x, T* __restrict__ out) {}"""
GOOD, BAD, SCALAR = (
    "_Z13op_fwd_kernelI13__nv_bfloat164ConvLi8EjEvPKT_PS2_",
    "_Z13op_fwd_kernelI13__nv_bfloat164ConvLi8EmEvPKT_PS2_",
    "_Z13op_fwd_kernelIf4ConvLi1EjEvPKT_PS1_",
)
NAMES = {
    GOOD: "void op_fwd_kernel<__nv_bfloat16, Conv, 8, unsigned int>(__nv_bfloat16 const*, __nv_bfloat16*)",
    BAD: "void op_fwd_kernel<__nv_bfloat16, Conv, 8, unsigned long>(__nv_bfloat16 const*, __nv_bfloat16*)",
    SCALAR: "void op_fwd_kernel<float, Conv, 1, unsigned int>(float const*, float*)",
}  # as c++filt prints them
PTX = f""".visible .entry {GOOD}(
\t.param .u64 p0
)
{{
\tld.global.nc.v4.u32 \t{{%r1, %r2, %r3, %r4}}, [%rd1];
\t@%p1 ld.global.nc.L1::no_allocate.v2.b64 \t{{%rd5, %rd6}}, [%rd2];
\tst.global.v4.b32 \t[%rd3], {{%r1, %r2, %r3, %r4}};
\tret;
}}
.entry {BAD}(
\t.param .u64 p0
)
{{
\t.local .align 4 .b8 \t__local_depot1[12];
\tld.global.nc.u32 \t%r1, [%rd1];
\tst.local.u32 \t[%rd4], %r1;
\tst.global.u16 \t[%rd3], %rs1;
\tret;
}}
.entry {SCALAR}(
\t.param .u64 p0
)
{{
\tld.global.nc.f32 \t%f1, [%rd1];
\tst.global.f32 \t[%rd3], %f1;
\tret;
}}"""
SASS = f"""\tcode for sm_90
\t\tFunction : {GOOD}
\t.headerflags\t@"EF_CUDA_TEXMODE_UNIFIED EF_CUDA_64BIT_ADDRESS EF_CUDA_SM90"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                 /* 0x00000a00ff017b82 */
        /*0010*/              @!P0 LDG.E.128.CONSTANT R4, desc[UR4][R2.64] ;
        /*0020*/                   STG.E.128 desc[UR4][R6.64], R4 ;
        /*0030*/                   EXIT ;
\t\t..........
\t\tFunction : {BAD}
        /*0000*/                   LDG.E.64 R4, desc[UR4][R2.64] ;
        /*0010*/                   STL [R1], R4 ;
        /*0020*/                   STG.E.U16 desc[UR4][R6.64], R4 ;
\t\tFunction : {SCALAR}
        /*0000*/                   LDG.E R4, desc[UR4][R2.64] ;
        /*0010*/                   STG.E desc[UR4][R6.64], R4 ;"""
BAD_NAME = "op_fwd_kernel<__nv_bfloat16, Conv, 8, unsigned long>"


def test_kernel_names():
    assert kernel_templates(CU) == {"op_fwd_kernel": ["T", "Fn", "ELEMS", "Index"]}
    name = (
        "void kgen_rmsnorm::(anonymous namespace)::rmsnorm_fwd_kernel<float, kgen_rmsnorm::(anonymous "
        "namespace)::Convention_single_rounding, 4, 8, 32, 1, (kgen_rmsnorm::(anonymous "
        "namespace)::RowStorage)0, "
        "true>(float const*, long, float const*, float*, long, long, long, kgen_rmsnorm::(anonymous "
        "namespace)::Params)"
    )
    assert template_args(name, "rmsnorm_fwd_kernel") == [
        "float",
        "kgen_rmsnorm::(anonymous namespace)::Convention_single_rounding",
        "4",
        "8",
        "32",
        "1",
        "(kgen_rmsnorm::(anonymous namespace)::RowStorage)0",
        "true",
    ]
    assert template_args(name, "rope_fwd_kernel") is None
    if shutil.which("c++filt"):
        assert demangle(list(NAMES)) == NAMES


def test_ptx_parser():
    functions = {name: ptx_accesses(body) for name, body in split_functions(PTX, PTX_FUNCTION, True).items()}
    assert [(f.loads, f.stores, f.local_bytes) for f in functions.values()] == [
        ({16: 2}, {16: 1}, 0),
        ({4: 1}, {2: 1}, 12),
        ({4: 1}, {4: 1}, 0),
    ]
    kernels = classify(CU, functions, NAMES)
    assert [(k.name, k.vector) for k in kernels] == [
        ("op_fwd_kernel<__nv_bfloat16, Conv, 8, unsigned int>", True),
        (BAD_NAME, True),
        ("op_fwd_kernel<float, Conv, 1, unsigned int>", False),
    ]
    assert vector_access_problems(kernels, "PTX") == [
        f"PTX: {BAD_NAME}: no ld.global.v4 (16 B) (loads 1×4B; stores 1×2B; local 2)",
        f"PTX: {BAD_NAME}: no st.global.v4 (16 B) (loads 1×4B; stores 1×2B; local 2)",
    ]
    assert local_memory_problems(kernels, "PTX", angles=True) == [  # not sincosf's buffer: no i2opi table
        f"PTX: {BAD_NAME}: local memory (12 B depot): ['.local [12]', 'st.local.u32']"
    ]
    sincos = ptx_accesses(".local .align 4 .b8 __local_depot0[28];\n mov.u64 %rd1, __cudart_i2opi_f;\n")
    assert local_memory_problems([Kernel("k", "float", True, sincos)], "PTX", angles=True) == []
    assert local_memory_problems([Kernel("k", "float", True, sincos)], "PTX", angles=False) != []


def test_sass_parser():
    functions = {name: sass_accesses(body, 8) for name, body in split_functions(SASS, SASS_FUNCTION).items()}
    assert [(f.loads, f.stores, f.local) for f in functions.values()] == [
        ({16: 1}, {16: 1}, []),
        ({8: 1}, {2: 1}, ["STL"]),
        ({4: 1}, {4: 1}, []),
    ]
    kernels = classify(CU, functions, NAMES)
    assert vector_access_problems(kernels, "SASS") == [
        f"SASS: {BAD_NAME}: no LDG.E.128 (loads 1×8B; stores 1×2B; local 1)",
        f"SASS: {BAD_NAME}: no STG.E.128 (loads 1×8B; stores 1×2B; local 1)",
    ]
    assert local_memory_problems(kernels, "SASS", angles=False) == [
        f"SASS: {BAD_NAME}: local memory (8 B stack frame): ['STL']"
    ]
    assert local_memory_problems(kernels, "SASS", angles=True) == []  # within sincosf's 32-byte frame


# ---------------------------------------------------------------------------------------------
# The hot kernels, compiled once per module (all ops at once, in parallel) for each evidence.
# ---------------------------------------------------------------------------------------------
def op_listing(evidence: str, op: str, root: Path) -> list[Kernel]:
    target = resolve_target(op, ARCH)
    project = write_project(target, root)
    src = project / f"{op}_cuda" / f"{op}.cu"
    profile = load_profile(ARCH)
    if evidence == "PTX":
        ptx = root / f"{op}.ptx"
        _run(
            [find_nvcc(), *NVCC_FLAGS, *gencode(profile), "-ptx", str(src), "-o", str(ptx)],
            f"nvcc -ptx {src.name}",
        )
        functions = {
            name: ptx_accesses(body)
            for name, body in split_functions(ptx.read_text(), PTX_FUNCTION, True).items()
        }
    else:
        obj = root / f"{op}.o"
        frames = {e.function: e.stack_frame for e in parse_ptxas(compile_kernel(project, op, profile, obj))}
        sass = _run([find_cuobjdump(), "-sass", str(obj)], f"cuobjdump -sass {obj.name}")
        functions = {
            name: sass_accesses(body, frames[name])
            for name, body in split_functions(sass, SASS_FUNCTION).items()
        }
    kernels = classify(src.read_text(), functions)
    vector_types = {k.dtype for k in kernels if k.vector}
    assert vector_types == {C_TYPES[d] for d in target.dtypes}, f"{op}: vector kernels for {vector_types}"
    return kernels


@pytest.fixture(scope="module", params=["PTX", "SASS"])
def listings(request, tmp_path_factory):
    """(evidence, op -> a future of its kernels): every hot op compiled at once, in parallel."""
    evidence = request.param
    if evidence == "SASS" and find_cuobjdump() is None:
        pytest.skip("no cuobjdump (a CUDA toolkit's bin/, or the test extras' wheel): the PTX variant checks")
    root = tmp_path_factory.mktemp(evidence.lower())
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        futures: dict[str, Future] = {op: pool.submit(op_listing, evidence, op, root) for op in HOT_OPS}
        yield evidence, futures


@pytest.mark.toolchain
@pytest.mark.parametrize("op", HOT_OPS)
def test_vector_kernels_issue_16_byte_global_loads_and_stores(listings, op):
    evidence, futures = listings
    kernels = futures[op].result()
    spec = load_spec(op)
    specs = [spec, family_of(spec).backward(spec)]
    row_writers = [f"{s.name}_kernel<" for s in specs if s and all(t.dims == "*rows" for t in s.outputs)]
    problems = vector_access_problems(kernels, evidence, row_writers)
    assert not problems, f"{op}: {len(problems)} missing 16-byte accesses\n" + "\n".join(problems[:10])


@pytest.mark.toolchain
@pytest.mark.parametrize("op", HOT_OPS)
def test_hot_kernels_use_no_local_memory(listings, op):
    evidence, futures = listings
    kernels = futures[op].result()
    grid = getattr(load_spec(op).structure, "grid", None)
    frame = PAYNE_HANEK_FRAME_FP64 if grid is not None and grid.precision == "float64" else PAYNE_HANEK_FRAME
    problems = local_memory_problems(kernels, evidence, grid is not None, frame)
    assert not problems, f"{op}: {len(problems)} kernels with local memory\n" + "\n".join(problems[:10])
