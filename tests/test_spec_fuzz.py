"""Hypothesis over op specs (CPU only): a spec built from any names, free text and small sympy math either
validates and renders a project in which its free text is inert (the same code and the same lines as with
blank text), or fails with pydantic's ValidationError naming the offending field; never an error from
inside jinja2, sympy or nvcc. A few valid specs are compiled with nvcc. Specs are built in memory and
rendered through the real loader ($KGEN_OPS_PATH/<name>.py takes the spec from a holder module)."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import re
import shutil
import sys
import types
from dataclasses import dataclass, field

import pytest
import sympy as sp
import tomllib
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from kgen.builder import compile_kernel, kernel_sources, render_target, write_project
from kgen.catalog import load_profile, load_spec
from kgen.dsl import Convention, Layer, OpSpec, Param, Tensor, to_io_dtype
from kgen.errors import KgenError
from kgen.families.elementwise import Elementwise
from kgen.families.rotary import GridAngles, Rotary
from kgen.families.row_reduce import Reduction, RowReduce
from kgen.project import resolve_target

HOLDER = "_kgen_fuzz_spec"  # the fuzz folder's <name>.py is `from _kgen_fuzz_spec import spec`
FUZZ = dict(deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


def reference(x, *rest, convention="plain", **params):
    return x


# -- free text: clean, nasty but harmless once validated, and what must never get through --------------------
ACCEPTABLE = [
    "#include <cstdio>",
    "} int main() { return 1; } //",
    '"; rm -rf / #',
    '${builtins.abort "x"}',
    "' + __import__('os').system('x') + '",
    "<!-- x --> <script>alert(1)</script>",
    "[/x] [bold]",
    "{{ banner }} {% raw %}",
    "ü · ² 😀 نص 漢字",
    "`code` | a | b",
    "/* open",
    '"',
    "'",
    '""',
    "# [x](y)",
]
HOSTILE = [
    "*/ #include <x>",
    "a\n#include <x>",
    '"""',
    "'''",
    "x\\",
    "\\N{BULLET}",
    "\\x41",
    "end ??/",
    "a\rb",
    "a\x00b",
    "a\u202eb",
    "a\u2028b",
    "a\tb",
    "a\x85b",
    "\ufeff",
    "\n",
]
clean_text = st.text(st.sampled_from("abcxyz XYZ019,.:()-"), min_size=1, max_size=30)
nasty_text = st.one_of(
    st.sampled_from(HOSTILE + ACCEPTABLE),
    st.text(max_size=12),
    st.lists(st.sampled_from(ACCEPTABLE + HOSTILE), min_size=2, max_size=3).map("".join),
)
HOSTILE_NAMES = [
    "X",
    "1x",
    "a-b",
    "../x",
    "x/y",
    "a.b",
    "",
    "x" * 41,
    "ünï",
    "int",
    "lambda",
    "class",
    "x\n",
    "x y",
    "_x",
    "nullptr",
    "def",
    "x;y",
    "x*/",
]

# -- names and math ------------------------------------------------------------------------------------------
POOL = ["a", "y", "up", "gate", "bias", "scale", "shift", "res", "w2"]  # input names besides x
OUTS, PARAMS, CONVS, STATS = (
    ["out", "out2"],
    ["eps", "alpha", "beta"],
    ["plain", "fast", "lib"],
    ["rstd", "mu"],
)
NUMBERS = [sp.Integer(1), sp.Integer(2), sp.Rational(1, 2), sp.Float(0.25), sp.pi]
FUNCTIONS = [sp.exp, sp.tanh, sp.erf, sp.Abs, to_io_dtype, sp.sqrt, sp.floor]


def _or_sum(make):
    """make(*args), or their sum where sympy refuses it (Max of a term it cannot compare, e.g.
    to_io_dtype(1))."""

    def build(args):
        try:
            return make(*args)
        except (TypeError, ValueError):
            return sp.Add(*args)

    return build


def exprs(names: list[str], rounds: bool = True):
    """Small sympy expressions over the given symbols: sums, products, powers, the supported functions (with
    to_io_dtype where ``rounds``: not in reductions and grid angles), Max, Piecewise."""
    functions = FUNCTIONS if rounds else [f for f in FUNCTIONS if f is not to_io_dtype]
    leaves = st.sampled_from([sp.Symbol(n) for n in names] + NUMBERS)
    pair = lambda c: st.tuples(c, c)  # noqa: E731
    branches = lambda c: st.one_of(  # noqa: E731
        pair(c).map(lambda p: p[0] + p[1]),
        pair(c).map(lambda p: p[0] * p[1]),
        st.tuples(c, st.sampled_from([2, 3, -1, sp.Rational(-1, 2)])).map(lambda p: p[0] ** p[1]),
        st.tuples(st.sampled_from(functions), c).map(lambda p: p[0](p[1])),
        pair(c).map(_or_sum(sp.Max)),
        st.tuples(c, c, c).map(_or_sum(lambda a, b, c: sp.Piecewise((a, b > 0), (c, True)))),
    )
    return st.recursive(leaves, branches, max_leaves=5).filter(
        lambda e: isinstance(e, sp.Expr) and not e.has(sp.zoo, sp.nan, sp.oo, -sp.oo, sp.I)
    )


@dataclass
class Plan:
    """A spec as plain data; ``build`` makes the OpSpec, with the free text as drawn or blanked."""

    name: str
    tensors: list[dict]
    params: list[dict]
    structure: tuple  # (constructor, kwargs)
    conventions: list[dict]
    summary: str = "an op"
    layer: dict | None = None
    peers: dict = field(default_factory=dict)
    inplace: dict = field(default_factory=dict)
    suspects: set = field(default_factory=set)  # fields (or message fragments) an error may name
    must_fail: bool = False

    def build(self, blank: bool = False) -> OpSpec:
        text = (lambda value, default="-": default) if blank else (lambda value, default="-": value)
        conventions = [Convention(**c | {"matches": text(c["matches"])}) for c in self.conventions]
        make, kwargs = self.structure
        layers = (
            []
            if self.layer is None
            else [Layer(**self.layer | {"replaces": [text(r, "m.Layer") for r in self.layer["replaces"]]})]
        )
        return OpSpec(
            name=self.name,
            summary=text(self.summary),
            tensors=[Tensor(**t | {"doc": text(t.get("doc", ""), "")}) for t in self.tensors],
            params=[Param(**p | {"doc": text(p.get("doc", ""), "")}) for p in self.params],
            structure=make(**kwargs, conventions=conventions),
            reference=reference,
            layers=layers,
            peers={text(n, f"peer{i}"): reference for i, n in enumerate(self.peers)},
            inplace=self.inplace,
        )

    def set_text(self, text: str) -> None:
        """The same text in every Text field: summary, docs, matches."""
        self.summary = text
        for item in self.tensors + self.params:
            item["doc"] = text
        for c in self.conventions:
            c["matches"] = text
        self.suspects |= {"summary", "doc", "matches"}


conv_names = st.lists(st.sampled_from(CONVS), min_size=1, max_size=3, unique=True)


@st.composite
def row_reduce(draw, inputs: list[str], outs: list[str], params: list[str]):
    n_rows = draw(st.integers(1, len(inputs)))
    rows, cols = inputs[:n_rows], inputs[n_rows:]
    tensors = [{"name": "x", "dims": "*rows hidden"}]
    tensors += [{"name": n, "dims": "*rows hidden", "broadcast": draw(st.booleans())} for n in rows[1:]]
    tensors += [{"name": n, "dims": "hidden"} for n in cols]
    for t in tensors[1:]:
        if draw(st.booleans()):
            t |= {"optional": True, "absent_value": draw(st.sampled_from([0.0, 1.0]))}
    tensors.sort(key=lambda t: t.get("optional", False))  # required inputs first (stable)
    prologue = {}
    if draw(st.booleans()):  # a value kept on chip instead of the row inputs, reading one of them
        prologue = {"r": draw(exprs(rows + params)) + sp.Symbol(draw(st.sampled_from(rows)))}
    values = list(prologue) or rows
    reductions, stats = [], []
    for stat in STATS[: draw(st.integers(1, 2))]:
        reductions.append(
            Reduction(
                stat=stat,
                summand=draw(exprs(values + params, rounds=False)),
                finalize=draw(exprs(["row_sum", "inv_hidden", *params, *stats], rounds=False)),
            )
        )
        stats.append(stat)
    symbols = values + cols + stats + params + ["hidden"]
    conventions = [{"name": c, "outputs": {o: draw(exprs(symbols)) for o in outs}} for c in draw(conv_names)]
    return tensors, (RowReduce, {"prologue": prologue, "reductions": reductions}), conventions, []


@st.composite
def elementwise(draw, inputs: list[str], outs: list[str], params: list[str]):
    halves = ["hx", "gx"] if draw(st.booleans()) else None
    tensors = [
        {"name": "x", "dims": "*rows 2*hidden", "halves": halves}
        if halves
        else {"name": "x", "dims": "*rows hidden"}
    ]
    extra = inputs[1 : draw(st.integers(1, 2))]
    tensors += [{"name": n, "dims": "*rows hidden"} for n in extra]
    symbols = (halves or ["x"]) + extra + params + ["hidden", "inv_hidden"]
    conventions = [{"name": c, "outputs": {o: draw(exprs(symbols)) for o in outs}} for c in draw(conv_names)]
    return tensors, (Elementwise, {}), conventions, []


@st.composite
def rotary(draw, inputs: list[str], outs: list[str], params: list[str]):
    rotated = ["x", "k"][: len(outs)]
    tensors = [{"name": n, "dims": "*rows hidden"} for n in rotated]
    kwargs = {
        "pairing": draw(st.sampled_from(["interleaved", "half"])),
        "rotates": rotated,
        "tables": ("cos", "sin"),
    }
    grid, sizes = draw(st.sampled_from([None, "sizes", "coordinates"])), []
    if grid is None:  # cos and sin tables
        dtype = draw(st.sampled_from(["io", "float32"]))
        tensors += [
            {"name": n, "dims": "*rows hidden", "dtype": dtype, "broadcast": True} for n in ("cos", "sin")
        ]
    else:  # angles from a latent grid of integer params, or from given coordinates
        axes = ["f", "h", "w"][: draw(st.integers(1, 3))]
        sizes = [f"n_{a}" for a in axes] if grid == "sizes" else []
        if grid == "coordinates":
            tensors.append({"name": "coords", "dims": "batch axes tokens", "dtype": "float32"})
        kwargs = {
            "pairing": "interleaved",
            "rotates": rotated,
            "grid": GridAngles(
                axes=axes,
                sizes=sizes,
                coordinates_input="coords" if grid == "coordinates" else None,
                coordinates=[draw(exprs([a, *params], rounds=False)) for a in axes],
                frequency=draw(exprs(["k", "n_freq", *params], rounds=False)),
                angle=draw(exprs(["freq", "coord", *params], rounds=False)),
            ),
        }
    conventions = [
        {
            "name": c,
            "outputs": {
                o: draw(exprs([r, f"{r}_pair", "cos", "sin", "sign", *params])) for o, r in zip(outs, rotated)
            },
        }
        for c in draw(conv_names)
    ]
    sizes = [
        {"name": s, "default": draw(st.integers(1, 8)), "integer": True, "positive": True} for s in sizes
    ]
    return tensors, (Rotary, kwargs), conventions, sizes


def symbols_in(value) -> set[str]:
    """The symbols of the sympy expressions in a value (a structure's arguments and nodes, conventions)."""
    if isinstance(value, sp.Basic):
        return {str(s) for s in value.free_symbols}
    if isinstance(value, BaseModel):
        value = dict(value)
    if isinstance(value, dict):
        value = list(value.values())
    return set().union(*map(symbols_in, value)) if isinstance(value, (list, tuple)) else set()


@st.composite
def plans(draw, nasty: bool = True, mutation=None) -> Plan:
    """A spec of one of the three structures. With ``nasty``, one free-text field in six gets nasty text
    (hostile payloads, any unicode); ``mutation`` adds a deliberate mistake that must be refused."""
    structure = draw(st.sampled_from([row_reduce, elementwise, rotary]))
    inputs = ["x", *draw(st.lists(st.sampled_from(POOL), max_size=3, unique=True))]
    outs = OUTS[: draw(st.integers(1, 2))]
    params = draw(st.lists(st.sampled_from(PARAMS), max_size=2, unique=True))
    tensors, structure, conventions, sizes = draw(structure(inputs, outs, params))
    used = symbols_in([structure[1], [c["outputs"] for c in conventions]])
    params = [p for p in params if p in used]  # a param no expression reads is refused
    tensors += [{"name": o, "dims": "*rows hidden", "role": "output"} for o in outs]
    plan = Plan(
        name="fz_" + draw(st.from_regex(r"[a-z0-9_]{1,12}", fullmatch=True)),
        tensors=tensors,
        params=sizes
        + [
            {"name": p, "default": draw(st.floats(1e-6, 1e4)), "positive": draw(st.booleans())}
            for p in params
        ],
        structure=structure,
        conventions=conventions,
    )

    def free_text(where: str, clean=clean_text) -> str:
        if nasty and draw(st.integers(0, 5)) == 0:
            plan.suspects.add(where)
            return draw(nasty_text if where != "replaces" else st.one_of(clean, nasty_text))
        return draw(clean)

    plan.summary = free_text("summary")
    for c in plan.conventions:
        c["matches"] = free_text("matches")
    for t in plan.tensors + plan.params:
        if draw(st.booleans()):
            t["doc"] = free_text("doc")
    if draw(st.booleans()):
        inputs = [t["name"] for t in plan.tensors if t.get("role") != "output"]
        path = st.sampled_from(["transformers.models.llama.modeling_llama.LlamaRMSNorm", "m.Norm"])
        plan.layer = {
            "name": "FuzzLayer",
            "replaces": [free_text("replaces", path)],
            "forward_args": ["states"],
            "convention": conventions[0]["name"],
            "bind": {n: "states" if n == "x" else f"self.{n}" for n in inputs},
        }
    if draw(st.booleans()):
        plan.peers = {free_text("peers"): None}
    if tensors[0]["dims"] == "*rows hidden" and draw(st.booleans()):
        plan.inplace = {outs[0]: "x"}
    if mutation is not None:
        mutation(draw, plan)
        plan.must_fail = True
    return plan


# -- deliberate mistakes: each must be refused, naming what it touched ---------------------------------------
def bad_name(draw, plan: Plan):
    bad = draw(
        st.one_of(
            st.sampled_from(HOSTILE_NAMES),
            st.text(max_size=8).filter(lambda s: not re.fullmatch(r"[a-z][a-z0-9_]{0,39}", s)),
        )
    )
    where = draw(
        st.sampled_from(
            ["op", "tensor", "param", "convention"] if plan.params else ["op", "tensor", "convention"]
        )
    )
    if where == "op":
        plan.name = bad
    else:
        {"tensor": plan.tensors, "param": plan.params, "convention": plan.conventions}[where][-1]["name"] = (
            bad
        )
    plan.suspects |= {"name"}


def duplicate(draw, plan: Plan):
    plan.params.append({"name": draw(st.sampled_from([t["name"] for t in plan.tensors])), "default": 1.0})
    plan.suspects |= {"repeated"}


def no_outputs(draw, plan: Plan):
    plan.tensors = [t for t in plan.tensors if t.get("role") != "output"]
    plan.suspects |= {"output", "tensors"}


def undeclared(draw, plan: Plan):
    outputs = plan.conventions[0]["outputs"]
    out = draw(st.sampled_from(sorted(outputs)))
    outputs[out] += sp.Symbol(draw(st.sampled_from(["zz", "undeclared", "row_sum"])))
    plan.suspects |= {"unknown symbols"}


def unprintable(draw, plan: Plan):
    make, kwargs = plan.structure
    if make is RowReduce and draw(st.booleans()):  # a rounding to the I/O dtype in fp32-only statistics code
        first = kwargs["reductions"][0]
        kwargs["reductions"][0] = Reduction(
            stat=first.stat, summand=first.summand, finalize=to_io_dtype(first.finalize)
        )
    else:
        outputs, h = plan.conventions[0]["outputs"], sp.Symbol("hidden")
        out = draw(st.sampled_from(sorted(outputs)))
        outputs[out] += draw(
            st.sampled_from(
                [
                    sp.I * h,
                    sp.zoo,
                    sp.Integral(h, h),
                    sp.atan(h),
                    sp.Function("f")(h),
                    sp.Mod(h, 3),
                    sp.Derivative(sp.Function("g")(h), h),
                ]
            )
        )
    plan.suspects |= {"no CUDA printing"}


def constant_prologue(draw, plan: Plan):
    make, kwargs = plan.structure
    if make is not RowReduce:
        return undeclared(draw, plan)
    kwargs["prologue"] = {"r": draw(exprs(["hidden"]))}  # values that read no row input
    plan.suspects |= {"prologue"}


def non_finite(draw, plan: Plan):
    value = draw(st.sampled_from([float("inf"), float("-inf"), float("nan")]))
    optional = [t for t in plan.tensors if t.get("optional")]
    if optional and draw(st.booleans()):
        optional[0]["absent_value"] = value
    else:
        plan.params.append({"name": "lam", "default": value})
    plan.suspects |= {"default", "absent_value"}


def bad_dims(draw, plan: Plan):
    plan.tensors[0]["dims"] = draw(
        st.sampled_from(["hidden\n", "*rows hidden; x", "rows", "*rows  hidden", ""])
    )
    plan.suspects |= {"dims"}


def bad_binding(draw, plan: Plan):
    inputs = [t["name"] for t in plan.tensors if t.get("role") != "output"]
    bad = draw(st.sampled_from(["h\n", "self.w; import os", "h)", "h, x", "self.__class__.__init__('x')"]))
    plan.layer = {
        "name": "FuzzLayer",
        "replaces": ["m.Norm"],
        "forward_args": ["h"],
        "convention": plan.conventions[0]["name"],
        "bind": {n: "h" for n in inputs} | {"x": bad},
    }
    plan.suspects |= {"bind"}


MUTATIONS = [
    bad_name,
    duplicate,
    no_outputs,
    undeclared,
    unprintable,
    constant_prologue,
    non_finite,
    bad_dims,
    bad_binding,
]


# -- the checks ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ops_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz_ops")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KGEN_OPS_PATH", str(folder))
        patch.setitem(sys.modules, HOLDER, types.ModuleType(HOLDER))
        yield folder
    load_spec.cache_clear()


@contextlib.contextmanager
def installed(spec: OpSpec, folder, dtypes: tuple[str, ...] | None = None):
    """The sm_90 target of an in-memory spec, found and loaded by the real loader."""
    sys.modules[HOLDER].spec = spec
    path = folder / f"{spec.name}.py"
    path.write_text(f"from {HOLDER} import spec\n")
    load_spec.cache_clear()
    try:
        target = resolve_target(spec.name, "sm_90")
        yield dataclasses.replace(target, dtypes=dtypes or target.dtypes)
    finally:
        path.unlink()
        load_spec.cache_clear()


def render(spec: OpSpec, folder) -> dict[str, str]:
    with installed(spec, folder) as target:
        return render_target(target)


def build(plan: Plan) -> OpSpec | None:
    """The spec, or None where it was refused with every error naming a field (or rule) the plan made
    suspect."""
    try:
        spec = plan.build()
    except ValidationError as err:
        event(f"refused: {err.title}")
        for e in err.errors():
            where = ".".join(str(part) for part in e["loc"])
            assert any(s in where or s in e["msg"] for s in plan.suspects), (
                f"{err.title}.{where}: {e['msg']} names none of {sorted(plan.suspects)}"
            )
        return None
    assert not plan.must_fail, f"a spec with a deliberate mistake validated: {plan}"
    event(f"rendered: {spec.structure.kind}")
    return spec


def docstrings_dropped(source: str, path: str) -> str:
    compile(source, path, "exec")  # syntax errors, and what only the compiler sees (a repeated argument)
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
        ):
            body[0] = ast.Pass()
    return ast.dump(tree)


NIX_DESCRIPTION = re.compile(r'  description = "((?:[^"\\$]|\\.|\$(?!\{))*)";')


def assert_inert(spec: OpSpec, files: dict[str, str], blank: dict[str, str]) -> None:
    """The project with the spec's text equals the one with blank text but for comments, docstrings and
    prose."""
    assert sorted(files) == sorted(blank)
    for path, text in files.items():
        lines, blank_lines = text.splitlines(), blank[path].splitlines()
        assert len(lines) == len(blank_lines), f"{path}: the free text added or removed lines"
        changed = [(line, before) for line, before in zip(lines, blank_lines) if line != before]
        if path.endswith(".py"):
            assert docstrings_dropped(text, path) == docstrings_dropped(blank[path], path), path
        elif path.endswith((".cu", ".h", ".cpp")):  # text only in // comments that end on their line
            for line, before in changed:
                code = line.split("//")[0].rstrip()  # a blank doc renders no comment at all
                assert "//" in line and code == before.split("//")[0].rstrip(), (path, line)
                assert not line.rstrip().endswith(("\\", "??/")), (path, line)
        elif path == "build.toml":
            assert tomllib.loads(text) == tomllib.loads(blank[path])
        elif path == "flake.nix":  # the summary, escaped, in the description string
            for line, _ in changed:
                match = NIX_DESCRIPTION.fullmatch(line)
                assert match, line
                assert re.sub(r"\\(.)", r"\1", match.group(1)) == f"{spec.summary} (sm_90), generated by kgen"
        else:
            assert path in ("CARD.md", ".gitignore"), path


@settings(max_examples=80, **FUZZ)
@given(plan=plans(mutation=None))
def test_a_spec_renders_inert_or_is_refused_naming_the_field(ops_dir, plan):
    """Specs of every structure, with nasty text here and there: refused naming the field, or rendered
    inert."""
    spec = build(plan)
    if spec is not None:
        assert_inert(spec, render(spec, ops_dir), render(plan.build(blank=True), ops_dir))


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: m.__name__)
def test_mistakes_are_refused_naming_the_field(mutation):
    @settings(max_examples=20, **FUZZ)
    @given(plan=plans(nasty=False, mutation=mutation))
    def refused(plan):
        assert build(plan) is None

    refused()


@pytest.mark.parametrize("payload", HOSTILE + ACCEPTABLE)
def test_text_payloads_are_refused_naming_the_field_or_inert(ops_dir, payload):
    """Each payload in every free-text field of a spec: hostile ones refused, the others inert."""

    @settings(max_examples=2, **FUZZ)
    @given(plan=plans(nasty=False))
    def refused_or_inert(plan):
        plan.set_text(payload)
        spec = build(plan)
        if spec is not None:
            assert_inert(spec, render(spec, ops_dir), render(plan.build(blank=True), ops_dir))
        assert (spec is None) == (payload in HOSTILE), "a hostile payload validated (and did no harm here)"

    refused_or_inert()


def test_every_text_field_refuses_hostile_text():
    """Each Text field (and the stricter replaces and peers) refuses each hostile payload, naming itself."""
    x, out = Tensor(name="x", dims="*rows hidden"), Tensor(name="out", dims="*rows hidden", role="output")
    conventions = [Convention(name="plain", matches="-", outputs={"out": sp.Symbol("x")})]
    op = dict(
        name="fz",
        summary="s",
        tensors=[x, out],
        structure=Elementwise(conventions=conventions),
        reference=reference,
    )
    fields = [
        ("summary", lambda v: OpSpec(**op | {"summary": v})),
        ("peers", lambda v: OpSpec(**op | {"peers": {v: reference}})),
        ("doc", lambda v: Tensor(name="x", dims="hidden", doc=v)),
        ("doc", lambda v: Param(name="e", default=1.0, doc=v)),
        ("matches", lambda v: Convention(name="c", matches=v, outputs={})),
        ("replaces", lambda v: Layer(name="L", replaces=[v], forward_args=["h"], bind={}, convention="c")),
    ]
    for name, make in fields:
        for payload in HOSTILE:
            with pytest.raises(ValidationError) as info:
                make(payload)
            assert [e["loc"][0] for e in info.value.errors()] == [name], (name, payload)
    for name in HOSTILE_NAMES:
        with pytest.raises(ValidationError, match=r"name\n"):
            Tensor(name=name, dims="hidden")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@settings(max_examples=3, **FUZZ)
@given(plan=plans(nasty=False), text=st.sampled_from(ACCEPTABLE))
def test_valid_specs_compile(ops_dir, tmp_path_factory, plan, text):
    """nvcc compiles the kernels of a valid spec (bf16; its derived backward's too), nasty but accepted
    text in every field."""
    plan.set_text(text)
    spec, out = plan.build(), tmp_path_factory.mktemp("fuzz_build")
    with installed(spec, ops_dir, dtypes=("bfloat16",)) as target:
        project = write_project(target, out)
    for i, source in enumerate(kernel_sources(project)["9.0"]):  # KgenError if nvcc fails
        compile_kernel(project, spec.name, load_profile("sm_90"), out / f"kernel{i}.o", source=source)


@settings(max_examples=60, deadline=None, database=None)
@given(
    name=st.one_of(
        st.sampled_from(
            [
                "../outside",
                "../../outside",
                "/tmp/outside",
                "sub/../outside",
                "..",
                ".",
                "outside",
                "_private",
                "x\x00",
                "",
            ]
        ),
        st.text(max_size=12),
    )
)
def test_op_names_never_reach_outside_the_spec_folders(tmp_path_factory, name):
    root = tmp_path_factory.getbasetemp() / "names"
    (root / "ops").mkdir(parents=True, exist_ok=True)
    (root / "outside.py").write_text("raise SystemExit('a spec outside the spec folders was loaded')\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KGEN_OPS_PATH", str(root / "ops"))
        load_spec.cache_clear()
        try:
            load_spec(name)  # a real op's name loads it
        except KgenError as err:
            assert f"unknown op {name!r}" in str(err)
        finally:
            load_spec.cache_clear()
