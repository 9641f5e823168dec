"""A malformed spec fails at load with the spec, the field and what is expected (Halide-style:
every bad program has its message)."""

from __future__ import annotations

import os
import re
import sys
import textwrap

import pytest

from kgen.builder import render_target
from kgen.catalog import backward_spec, data_dir, load_families, load_spec, op_names, spec_hash, suite
from kgen.dsl import BUILTIN_SYMBOLS, GENERATED_NAMES, GENERATED_SUFFIXES
from kgen.errors import KgenError
from kgen.families.base import Case
from kgen.project import resolve_target

GOOD = {
    "name": '"bad"',
    "tensors": '[Tensor(name="x", dims="*rows hidden"), Tensor(name="weight", dims="hidden", optional=True, '
    'absent_value=1.0), Tensor(name="out", dims="*rows hidden", role="output")]',
    "params": '[Param(name="eps", default=1e-6, positive=True)]',
    "reductions": '[Reduction(stat="rstd", summand=x**2, finalize=1 / sp.sqrt(row_sum * inv_hidden + eps))]',
    "conventions": '[Convention(name="plain", matches="-", outputs={"out": x * rstd * weight})]',
    "layers": "[]",
    "ref_body": "return x",
    "ref_args": 'x, weight=None, eps=1e-6, convention="plain"',
}

TEMPLATE = """
import sympy as sp
from kgen.dsl import *
from kgen.families.row_reduce import *
x, y, weight, eps, rstd = sp.symbols("x y weight eps rstd")
def ref({ref_args}):
    {ref_body}
spec = OpSpec(name={name}, summary="a test op", tensors={tensors}, params={params},
              structure=RowReduce(reductions={reductions}, conventions={conventions}),
              reference=ref, layers={layers})
"""

CASES = [
    ({"name": '"Bad-Op"'}, ["OpSpec.name: String should match pattern"]),
    (
        {"tensors": GOOD["tensors"].replace('"*rows hidden"', '"rows d"', 1)},
        ["tensors.0.dims: row_reduce ops take tensors of dims '*rows hidden' or 'hidden', got 'rows d'"],
    ),
    (
        {"tensors": GOOD["tensors"].replace('"*rows hidden"', '"*rows\\nhidden"', 1)},
        ["Tensor.dims: String should match pattern"],
    ),
    (
        {"reductions": '[Reduction(stat="rstd", summand=y**2, finalize=row_sum)]'},
        ["OpSpec: Value error, structure.reductions.0.summand: unknown symbols ['y']"],
    ),
    (
        {"reductions": '[Reduction(stat="rstd", summand="x**2", finalize=row_sum)]'},
        ["Reduction.summand: Value error, expected a sympy expression, got str"],
    ),
    (
        {"reductions": '[Reduction(stat="rstd", summand=sp.atan(x), finalize=row_sum)]'},
        ["structure.reductions.0.summand: functions ['atan'] have no CUDA printing"],
    ),
    (
        {"reductions": '[Reduction(stat="rstd", summand=weight, finalize=row_sum)]'},
        ["structure.reductions.0.summand: unknown symbols ['weight']"],
    ),
    (
        {"tensors": GOOD["tensors"].replace(", absent_value=1.0", "")},
        ["optional tensor 'weight' needs absent_value"],
    ),
    (
        {"tensors": GOOD["tensors"].replace('dims="*rows hidden"', 'dims="*rows hidden", broadcast=True', 1)},
        ["an op's first '*rows ...' input leads", "required, in the I/O dtype and not broadcast"],
    ),
    (
        {
            "tensors": GOOD["tensors"].replace(
                'dims="*rows hidden"', 'dims="*rows hidden", dtype="float32"', 1
            )
        },
        ["an op's first '*rows ...' input leads"],
    ),
    (
        {"tensors": GOOD["tensors"].replace('dims="*rows hidden"', 'dims="*rows 2*hidden"', 1)},
        [
            "Tensor: Value error, tensor 'x' (dims '*rows 2*hidden'): 'halves' names the two halves of a "
            "'*rows 2*hidden' input"
        ],
    ),
    (
        {
            "tensors": GOOD["tensors"].replace(
                'dims="*rows hidden"', 'dims="*rows 2*hidden", halves=("a", "b")', 1
            )
        },
        [
            "tensors.0.dims: row_reduce ops take tensors of dims '*rows hidden' or 'hidden', got '*rows "
            "2*hidden'"
        ],
    ),
    (
        {"tensors": GOOD["tensors"].replace("optional=True", "optional=True, broadcast=True")},
        ["tensor 'weight': only a '*rows hidden' input can broadcast"],
    ),
    (
        {
            "conventions": '[Convention(name="plain", matches="-", outputs={"out": x * rstd}, prologue={"r": '
            "x})]"
        },
        ["structure.conventions.0.prologue: may only replace the structure's prologue values [], got ['r']"],
    ),
    (
        {"conventions": '[Convention(name="plain", matches="-", outputs={"y": x})]'},
        [
            "structure.conventions.0.outputs: expected one expression for each of ['out'] (a packed output's "
            "halves), got ['y']"
        ],
    ),
    (
        {"ref_body": "return sp.Abs(x) * torch.ones(1)"},
        [
            "reference uses ['sp'] from its module; a generated project's test copies the reference and the "
            "functions it calls"
        ],
    ),
    ({"conventions": "[]"}, ["RowReduce.conventions: List should have at least 1 item"]),
    (
        {"tensors": GOOD["tensors"].replace('role="output"', 'role="result"')},
        ["Tensor.role: Input should be 'input' or 'output'"],
    ),
    (
        {"params": '[Param(name="eps", default=1e-6, positive=True, unit="s")]'},
        ["Param.unit: Extra inputs are not permitted"],
    ),
    (
        {"params": '[Param(name="rstd", default=1.0)]'},
        [
            "names must be unique across tensors, halves, params and the structure's values; repeated: "
            "['rstd']"
        ],
    ),
    (
        {
            "layers": '[Layer(name="RMSNorm", replaces=["m.RMSNorm"], forward_args=["h"], '
            'convention="plain", '
            'bind={"x": "h", "weight": "self.weight; import os", "eps": "self.eps"})]'
        },
        [
            "Layer.bind.weight: Value error, must be a forward argument, 'self.<attribute>' or "
            "'self.<submodule>(<forward argument>)' (got 'self.weight; import os')"
        ],
    ),
    (
        {
            "layers": '[Layer(name="RMSNorm", replaces=["m.RMSNorm"], forward_args=["h"], '
            'convention="plain", '
            'bind={"x": "self.proj(hidden)", "weight": "w"})]'
        },
        ["layers.0.bind: ['hidden', 'w'] are not forward arguments ['h']"],
    ),
    (
        {
            "layers": '[Layer(name="RMSNorm", replaces=["m.RMSNorm"], forward_args=["h"], '
            'convention="plain", '
            'bind={"x": "self.proj(h)", "weight": "self.weight"}, returns="self.out(h)")]'
        },
        ["Layer.returns: String should match pattern"],
    ),
    (
        {
            "layers": '[Layer(name="RMSNorm", replaces=["m.RMSNorm"], forward_args=["h", "dim"], '
            'convention="plain", '
            'bind={"x": "h", "weight": "self.weight"})]'
        },
        [
            "layers.0.defaults: every forward argument no op argument is bound to needs one, and they are "
            "the last "
            "arguments; got {} for ['h', 'dim']"
        ],
    ),
    (
        {
            "layers": '[Layer(name="RMSNorm", replaces=["m.RMSNorm"], forward_args=["dim", "h"], '
            'convention="plain", '
            'defaults={"dim": 1}, bind={"x": "h", "weight": "self.weight"})]'
        },
        [
            "layers.0.defaults: every forward argument no op argument is bound to needs one, and they are "
            "the last "
            "arguments; got {'dim': 1} for ['dim', 'h']"
        ],
    ),
    (
        {
            "layers": '[Layer(name="RMSNorm", replaces=["m.RMSNorm"], forward_args=["h", "dim"], '
            'convention="plain", '
            'defaults={"dim": "1; import os"}, bind={"x": "h", "weight": "self.weight"})]'
        },
        ["Layer.defaults.dim.bool: Input should be a valid boolean"],
    ),
    (
        {
            "layers": '[Layer(name="RMSNorm", replaces=["m.RMSNorm"], forward_args=["h"], convention="fast", '
            'bind={"x": "h", "weight": "self.weight"})]'
        },
        ["layers.0.convention: 'fast' is not one of ['plain']"],
    ),
    (
        {
            "layers": '[Layer(name="rms_norm", replaces=["m.RMSNorm"], forward_args=["h"], '
            'convention="plain", '
            'bind={"x": "h", "weight": "self.weight"})]'
        },
        ["Layer.name: String should match pattern"],
    ),
    # free text and names end up in generated C++, Python, Markdown and Nix: nothing may break out of them
    (
        {"tensors": GOOD["tensors"].replace('name="out"', 'name="int"')},
        ["Tensor.name: Value error, must be a name that is no Python or C++ keyword (got 'int')"],
    ),
    (
        {"params": '[Param(name="eps", default=1e-6, doc="*/ #include <evil.h>")]'},
        ["Param.doc: Value error, must be one printable line without a backslash, '*/'"],
    ),
    (
        {
            "conventions": '[Convention(name="plain", matches="one\\ntwo", outputs={"out": x * rstd * '
            "weight})]"
        },
        ["Convention.matches: Value error, must be one printable line", "(got 'one\\ntwo')"],
    ),
    (
        {"params": '[Param(name="eps", default=float("inf"))]'},
        ["Param.default: Input should be a finite number"],
    ),
    (
        {
            "layers": '[Layer(name="RMSNorm", replaces=["m.RMSNorm; import os"], forward_args=["h"], '
            'convention="plain", '
            'bind={"x": "h", "weight": "self.weight"})]'
        },
        ["Layer.replaces.0: String should match pattern"],
    ),
    (
        {"reductions": '[Reduction(stat="rstd", summand=x**2, finalize=to_io_dtype(row_sum))]'},
        ["structure.reductions.0.finalize: functions ['to_io_dtype'] have no CUDA printing here"],
    ),
    (
        {"conventions": '[Convention(name="plain", matches="-", outputs={"out": x * rstd * sp.I})]'},
        ["structure.conventions.0.outputs.out: functions ['ImaginaryUnit'] have no CUDA printing"],
    ),
    # an undefined function with a printable name is not that function: sigmoid failed to print at build,
    # tanh printed but had no derivative
    (
        {
            "conventions": '[Convention(name="plain", matches="-", '
            'outputs={"out": x * sp.Function("sigmoid")(rstd)})]'
        },
        [
            "outputs.out: sigmoid is an undefined sympy function (sp.Function('sigmoid'))",
            "use kgen.dsl.sigmoid",
        ],
    ),
    (
        {"reductions": '[Reduction(stat="rstd", summand=sp.Function("tanh")(x), finalize=row_sum + eps)]'},
        ["structure.reductions.0.summand: tanh is an undefined sympy function", "use sympy.tanh"],
    ),
    # a param's default is a number: True and "0.01" were read as 1.0 and 0.01
    (
        {"params": '[Param(name="eps", default=True)]'},
        ["Param.default: Input should be a valid number (got True)"],
    ),
    (
        {"params": '[Param(name="eps", default="0.01")]'},
        ["Param.default: Input should be a valid number (got '0.01')"],
    ),
    # names the generated C++ declares beside the spec's (each of these failed to compile before it was
    # refused)
    (
        {"params": '[Param(name="eps", default=1e-6, positive=True), Param(name="op", default=1.0)]'},
        ["names ['op'] are reserved for kgen's own symbols (identifiers of the generated code"],
    ),
    (
        {"tensors": GOOD["tensors"].replace('name="weight"', 'name="params"')},
        ["names ['params'] are reserved"],
    ),
    (
        {"params": '[Param(name="eps", default=1e-6, positive=True), Param(name="guard", default=1.0)]'},
        ["names ['guard'] are reserved"],
    ),
    (
        {"tensors": GOOD["tensors"].replace('name="weight"', 'name="x_rows"')},
        ["names ['x_rows'] are reserved", "another name plus a suffix the generated code appends"],
    ),
    (
        {
            "params": '[Param(name="eps", default=1e-6, positive=True), Param(name="x_row_stride", '
            "default=1.0)]"
        },
        ["names ['x_row_stride'] are reserved"],
    ),
    (
        {
            "tensors": GOOD["tensors"].replace('name="weight"', 'name="k"')
        },  # a loop variable of the row kernels
        ["names ['k'] are reserved"],
    ),
    (
        {"params": '[Param(name="eps", default=-1.0, positive=True)]'},
        ["Param: Value error, param 'eps' is positive: its default must be > 0, got -1.0"],
    ),
    (
        {"ref_args": "x, weight=None"},
        [
            "reference(x, weight=None) cannot be called as ref(x, weight, eps) with the spec's inputs and "
            "params: "
            "too many positional arguments"
        ],
    ),
    (
        {"ref_args": 'x, weight=None, convention="plain"'},
        [
            "cannot be called as ref(x, weight, eps=...) with the spec's inputs and params: got an "
            "unexpected keyword"
        ],
    ),
    (
        {
            "tensors": GOOD["tensors"].replace(
                'dims="hidden", optional=True', 'dims="hidden", dtype="int64", optional=True'
            )
        },
        ["tensor 'weight': an int64 tensor is a required input (indices)"],
    ),
    (
        {
            "tensors": GOOD["tensors"].replace(
                'dims="hidden", optional=True, absent_value=1.0', 'dims="hidden", dtype="int64"'
            )
        },
        ["['weight']: row_reduce ops take no int64 tensors"],
    ),
]


@pytest.fixture
def ops_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KGEN_OPS_PATH", str(tmp_path))
    load_spec.cache_clear()
    yield tmp_path
    load_spec.cache_clear()


def write_spec(folder, file="bad", **overrides):
    fields = GOOD | overrides
    (folder / f"{file}.py").write_text(textwrap.dedent(TEMPLATE.format(**fields)))


def test_the_good_spec_loads(ops_dir):
    write_spec(ops_dir)
    assert load_spec("bad").default_convention == "plain"


@pytest.mark.parametrize("overrides,fragments", CASES, ids=[f[0].split(":")[0] for _, f in CASES])
def test_bad_spec_message(ops_dir, overrides, fragments):
    write_spec(ops_dir, **overrides)
    with pytest.raises(KgenError) as info:
        load_spec("bad")
    message = str(info.value)
    assert message.startswith(f"spec 'bad' ({ops_dir / 'bad.py'}:")  # with the line number
    for fragment in fragments:
        assert fragment in message


def test_module_without_spec(ops_dir):
    (ops_dir / "helpers.py").write_text("x = 1\n")
    with pytest.raises(
        KgenError,
        match=r"must define `spec = OpSpec\(...\)`; if it is a helper module, not a spec, "
        r"name it _helpers.py \(kgen loads no file starting with '_' as a spec\)",
    ):
        load_spec("helpers")
    (ops_dir / "helpers.py").rename(ops_dir / "_helpers.py")
    assert "helpers" not in op_names() and "_helpers" not in op_names()


def test_every_param_is_read(ops_dir):
    """A param the math ignores (it hard-codes the value) is refused; one the structure reads by name (a
    grid's sizes) or its family requires (a softmax loss's ignore_index) is used."""
    write_spec(
        ops_dir,
        params='[Param(name="eps", default=1e-6, positive=True), Param(name="slope", default=0.01)]',
        ref_args='x, weight=None, eps=1e-6, slope=0.01, convention="plain"',
    )
    with pytest.raises(KgenError) as info:
        load_spec("bad")
    assert str(info.value) == (
        f"spec 'bad' ({ops_dir / 'bad.py'}) is invalid:\n  OpSpec.params: param 'slope' is not used by the "
        "math of any convention; use its symbol in an expression, or remove the param"
    )
    for op in ("rope3d", "cross_entropy"):
        assert not load_spec(op).unused_params()
    # a derived backward keeps the forward's params, whether its gradients read them or not
    (ops_dir / "bad.py").write_text(
        STRUCTURES.format(
            tensors='[Tensor(name="x", dims="*rows hidden"), Tensor(name="out", dims="*rows hidden", '
            'role="output")]',
            params='[Param(name="shift", default=0.5)]',
            structure='Elementwise(conventions=[Convention(name="plain", matches="-", outputs={"out": x + '
            'sp.Symbol("shift")})])',
            inplace="{}",
        )
    )
    load_spec.cache_clear()
    assert backward_spec("bad").unused_params() == ["shift"]


def write_helper_spec(folder, name, helper="EPS = 1e-6\n", importing="from _common import EPS"):
    """A spec whose eps default comes from the helper module _common.py beside it."""
    (folder / "_common.py").write_text(helper)
    write_spec(folder, file=name, name=repr(name), params='[Param(name="eps", default=EPS, positive=True)]')
    text = (folder / f"{name}.py").read_text()
    (folder / f"{name}.py").write_text(f"from kgen.catalog import load_spec\n{importing}\n{text}")


def test_a_spec_imports_the_helpers_beside_it(tmp_path, monkeypatch):
    """They were not importable (ModuleNotFoundError: No module named '_common'). While a spec executes its
    folder's helpers import by plain name, then none stays importable; two folders' helpers of one name do
    not meet, where a spec loads another folder's either."""
    first, second = tmp_path / "a", tmp_path / "b"
    for folder in (first, second):
        folder.mkdir()
    loads_second = 'load_spec("second")\nimport _common as again\nassert again.EPS == 1e-6'  # its own again
    write_helper_spec(first, "first", importing=f"import _common\nEPS = _common.EPS\n{loads_second}")
    write_helper_spec(second, "second", "EPS = 1e-5\n")
    monkeypatch.setenv("KGEN_OPS_PATH", os.pathsep.join(map(str, (first, second))))
    load_spec.cache_clear()
    try:
        assert load_spec("first").params[0].default == 1e-6
        assert load_spec("second").params[0].default == 1e-5
        assert "_common" not in sys.modules and not {str(first), str(second)} & set(sys.path)
    finally:
        load_spec.cache_clear()


def test_the_spec_hash_covers_the_helpers_it_imports(ops_dir):
    write_helper_spec(ops_dir, "bad")
    (ops_dir / "_unused.py").write_text("X = 1\n")
    before = spec_hash("bad")
    (ops_dir / "_unused.py").write_text("X = 2\n")
    load_spec.cache_clear()
    assert spec_hash("bad") == before
    (ops_dir / "_common.py").write_text("EPS = 1e-5\n")
    load_spec.cache_clear()
    assert spec_hash("bad") != before and load_spec("bad").params[0].default == 1e-5


def test_a_spec_may_not_take_a_builtin_ops_name(ops_dir):
    """It replaced kgen's own rmsnorm, and broke kgen's ops that load it: every command refuses it."""
    write_spec(ops_dir, file="rmsnorm", name='"rmsnorm"')
    own = data_dir("ops") / "rmsnorm.py"
    for read in (op_names, lambda: load_spec("rmsnorm"), lambda: load_spec("qk_norm_rope")):
        with pytest.raises(KgenError) as info:
            read()
        assert str(info.value) == (
            f"spec 'rmsnorm' ({ops_dir / 'rmsnorm.py'}) has the name of kgen's own op 'rmsnorm' ({own}), "
            "which it would hide (kgen's other ops load theirs by name): "
            "rename it, its file and its OpSpec name"
        )


def test_two_folders_may_not_hold_one_op(tmp_path, monkeypatch):
    """The first folder's spec won, silently."""
    first, second = tmp_path / "a", tmp_path / "b"
    for folder in (first, second):
        folder.mkdir()
        write_spec(folder)
    monkeypatch.setenv("KGEN_OPS_PATH", os.pathsep.join(map(str, (first, second))))
    load_spec.cache_clear()
    with pytest.raises(
        KgenError, match=r"spec 'bad' \(.*/a/bad.py\) has the name of the op 'bad' \(.*/b/bad.py\)"
    ):
        op_names()
    load_spec.cache_clear()


def test_families_path_entries_are_folders(tmp_path, monkeypatch):
    """A $KGEN_FAMILIES_PATH entry that is no folder was skipped: its specs then had an unknown structure."""
    monkeypatch.setenv("KGEN_FAMILIES_PATH", str(tmp_path / "missing"))
    with pytest.raises(KgenError, match=r"^\$KGEN_FAMILIES_PATH names .*/missing, which does not exist"):
        load_families()


def test_ops_path_entries_are_folders(tmp_path, monkeypatch):
    """An entry that is no folder was skipped: its ops were then "unknown"."""
    (tmp_path / "file.py").write_text("")
    for entry, what in [(tmp_path / "missing", "does not exist"), (tmp_path / "file.py", "is not a folder")]:
        monkeypatch.setenv("KGEN_OPS_PATH", os.pathsep.join([str(tmp_path), str(entry)]))
        load_spec.cache_clear()
        message = f"$KGEN_OPS_PATH names {entry}, which {what}: fix or remove the entry"
        for read in (op_names, lambda: load_spec("rmsnorm"), lambda: suite("rmsnorm")):
            with pytest.raises(KgenError) as info:
                read()
            assert str(info.value) == message
    load_spec.cache_clear()


@pytest.mark.parametrize(
    "toml, fragment",
    [
        (
            "[bad]\nshapes = [8192, 4096]",
            "[bad].shapes: Value error, one shape where a list of shapes is expected: "
            "write shapes = [[8192, 4096]]",
        ),
        ("[bad]\nshape = [[8, 16]]", "[bad].shape: Extra inputs are not permitted"),
        (
            "[bad]\nshapes = [[8, 16]]\n[leaky_reul]\nshapes = [[8, 16]]",
            "[leaky_reul]: no op is named 'leaky_reul'",
        ),
        ("[bad]\nshapes = [[8192, 0]]", "[bad].shapes.0.shape.1: Input should be greater than 0 (got 0)"),
        (
            "[bad]\nshapes = [{shape = [8, 16], per_batch = 1}]",
            "[bad].shapes.0.per_batch: Input should be a valid boolean",
        ),
        ("[bad]\nshapes = [[8, 16], 'x']", "[bad].shapes.1: Value error, a shape is a list of dims"),
        ("shapes = [[8, 16]]", "shapes: a key outside the [<op>] tables"),
        (
            "[bad]\nshapes = [[8, 16], {shape = [8, 16], params = {esp = 1e-5}}]",
            "[bad].shapes.1.params.esp: bad has no param 'esp' (did you mean 'eps'?); its params: eps",
        ),
    ],
    ids=[
        "one shape",
        "misspelt key",
        "unknown op",
        "zero dim",
        "int flag",
        "no shape",
        "key outside",
        "misspelt param",
    ],
)
def test_shapes_file_errors(ops_dir, toml, fragment):
    """A shape that is none crashed or was taken, a misspelt key or op name was skipped."""
    write_spec(ops_dir)
    (ops_dir / "shapes.toml").write_text(toml + "\n")
    with pytest.raises(KgenError) as info:
        suite("bad")
    assert str(info.value).startswith(f"shapes file {ops_dir / 'shapes.toml'} is invalid:\n  ")
    assert fragment in str(info.value)


def test_shapes_files_load(ops_dir):
    write_spec(ops_dir)
    (ops_dir / "shapes.toml").write_text(
        "[bad]\nshapes = [[8, 16], { shape = [2, 4, 16], per_batch = true }]\n"
    )
    assert suite("bad") == [Case((8, 16)), Case((2, 4, 16), per_batch=True)]
    assert all(suite(op) for op in op_names() if op != "bad")  # kgen's own bench/shapes.toml lists every op


def test_shapes_file_integer_params(ops_dir):
    """An integer param's value was cut to an integer (2.5 ran as 2)."""
    (ops_dir / "bad.py").write_text(
        SOFTMAX_LOSS.format(
            tensors=LOSS_TENSORS,
            params='[Param(name="ignore_index", default=-100, integer=True)]',
            logit="logits",
        )
    )
    shapes = ops_dir / "shapes.toml"
    shapes.write_text("[bad]\nshapes = [{shape = [8, 16], params = {ignore_index = 2.5}}]\n")
    with pytest.raises(KgenError) as info:
        suite("bad")
    assert str(info.value) == (
        f"shapes file {shapes} is invalid:\n  [bad].shapes.0.params.ignore_index: ignore_index is an integer "
        "param (got 2.5)"
    )
    shapes.write_text("[bad]\nshapes = [{shape = [8, 16], params = {ignore_index = 2}}]\n")
    assert suite("bad") == [Case((8, 16), params=(("ignore_index", 2),))]


def test_shapes_file_positive_params(ops_dir):
    """A positive param's value <= 0 was left for the binding to refuse at run time."""
    write_spec(ops_dir)
    shapes = ops_dir / "shapes.toml"
    shapes.write_text("[bad]\nshapes = [{shape = [8, 16], params = {eps = 0.0}}]\n")
    with pytest.raises(KgenError) as info:
        suite("bad")
    assert str(info.value) == (
        f"shapes file {shapes} is invalid:\n  [bad].shapes.0.params.eps: eps must be > 0 (got 0.0)"
    )
    shapes.write_text("[bad]\nshapes = [{shape = [8, 16], params = {eps = 1e-5}}]\n")
    assert suite("bad") == [Case((8, 16), params=(("eps", 1e-5),))]


def test_name_must_match_file(ops_dir):
    write_spec(ops_dir, file="other")
    with pytest.raises(KgenError, match="name 'bad' must equal the file name 'other'"):
        load_spec("other")


def test_unknown_op_lists_known_ones(ops_dir):
    with pytest.raises(KgenError, match=r"unknown op 'nope'; known ops: .*rmsnorm"):
        load_spec("nope")
    with pytest.raises(KgenError, match=r"unknown op 'rmsnom' \(did you mean 'rmsnorm'\?\); known ops"):
        load_spec("rmsnom")


STRUCTURES = """
import sympy as sp
from kgen.dsl import *
from kgen.families.elementwise import *
from kgen.families.rotary import *
from kgen.families.row_reduce import *
x, x_pair, h, gate, k = sp.symbols("x x_pair h gate k")
def ref(x, *rest, convention="plain", **params):
    return x
spec = OpSpec(name="bad", summary="a test op", tensors={tensors}, params={params}, structure={structure},
              reference=ref, inplace={inplace})
"""
ROTARY = (
    'Rotary(pairing="interleaved", rotates=["x"], tables=("cos", "sin"), '
    'conventions=[Convention(name="plain", '
    'matches="-", outputs={"out": x * cos + sign * x_pair * sin})])'
)
TABLES = (
    '[Tensor(name="x", dims="*rows hidden"), Tensor(name="cos", dims="*rows hidden", dtype="float32", '
    'broadcast=True), Tensor(name="sin", dims="*rows hidden", dtype="float32", broadcast=True), '
    'Tensor(name="out", dims="*rows hidden", role="output")]'
)
STRUCTURE_CASES = [
    (
        {
            "tensors": '[Tensor(name="x", dims="*rows 2*hidden", halves=("h", "gate")), Tensor(name="w", '
            'dims="hidden"), '
            'Tensor(name="out", dims="*rows hidden", role="output")]',
            "structure": 'Elementwise(conventions=[Convention(name="plain", matches="-", outputs={"out": h * '
            "gate})])",
        },
        "tensors.1.dims: elementwise ops take tensors of dims '*rows hidden' or '*rows 2*hidden', got "
        "'hidden'",
    ),
    (
        {
            "tensors": '[Tensor(name="x", dims="*rows 2*hidden", halves=("h", "gate")), '
            'Tensor(name="out", dims="*rows hidden", role="output")]',
            "structure": 'Elementwise(conventions=[Convention(name="plain", matches="-", outputs={"out": '
            "x})])",
        },
        "structure.conventions.0.outputs.out: unknown symbols ['x']; allowed here: ['gate', 'h', 'hidden', "
        "'inv_hidden']",
    ),
    (
        {"tensors": TABLES.replace(", broadcast=True", "", 1)},
        "a rotary op without grid angles names its cos and sin tensors in `tables`, each with broadcast=True",
    ),
    (
        {
            "structure": ROTARY.replace(
                "Rotary(",
                'Rotary(grid=GridAngles(axes=["f"], sizes=["n"], coordinates=[k], '
                "frequency=k, angle=freq * coord), ",
            )
        },
        "grid angles serve interleaved pairs, with no cos/sin tensors",
    ),
    (
        {"structure": ROTARY.replace('rotates=["x"]', 'rotates=["cos"]')},
        "structure.rotates: ['cos'] must name",
    ),
    (
        {"structure": ROTARY.replace('tables=("cos", "sin")', 'tables=("cos", "tan")')},
        "the cos and sin tables it names in `tables`",
    ),
    (
        {"tensors": TABLES.replace('name="x"', 'name="x", broadcast=True')},
        "an op's first '*rows ...' input leads",
    ),
    ({"inplace": '{"out": "cos"}'}, "inplace: a rotary op's output may only overwrite its own rotated input"),
    (
        {
            "inplace": '{"out": "y"}',
            "tensors": '[Tensor(name="x", dims="*rows hidden"), '
            'Tensor(name="out", dims="*rows hidden", role="output")]',
            "structure": 'Elementwise(conventions=[Convention(name="plain", matches="-", outputs={"out": '
            "x})])",
        },
        "inplace: maps outputs ['out'] to the inputs they overwrite, required '*rows hidden' inputs of the "
        "same shape ['x']",
    ),
    (
        {"params": '[Param(name="n", default=2.5, integer=True)]'},
        "integer param 'n' needs an integer default, got 2.5",
    ),
    (
        {
            "tensors": '[Tensor(name="x", dims="*rows hidden"), Tensor(name="out", dims="*rows hidden", '
            'role="output")]',
            "structure": 'RowReduce(prologue={"r": sp.Integer(2)}, reductions=[Reduction(stat="s", '
            'summand=sp.Symbol("r"), '
            'finalize=sp.Symbol("row_sum"))], conventions=[Convention(name="plain", matches="-", '
            'outputs={"out": x})])',
        },
        "structure.prologue: reads no '*rows ...' input",
    ),
    (  # a row the reductions read is kept on chip in the I/O dtype: a float32 one would be rounded
        {
            "tensors": '[Tensor(name="x", dims="*rows hidden"), Tensor(name="h", dims="*rows hidden", '
            'dtype="float32"), Tensor(name="out", dims="*rows hidden", role="output")]',
            "structure": 'RowReduce(reductions=[Reduction(stat="s", summand=x + h, '
            'finalize=sp.Symbol("row_sum"))], conventions=[Convention(name="plain", matches="-", '
            'outputs={"out": x * sp.Symbol("s")})])',
        },
        "['h']: float32 row inputs the reductions read would be kept on chip in the I/O dtype",
    ),
    (
        {
            "tensors": '[Tensor(name="x", dims="*rows hidden"), Tensor(name="h", dims="*rows hidden", '
            'dtype="float32"), Tensor(name="out", dims="*rows hidden", role="output")]',
            "structure": 'Elementwise(conventions=[Convention(name="plain", matches="-", outputs={"out": '
            "x * h})])",
        },
        "an elementwise op's tensors all have the I/O dtype",
    ),
    (
        {"tensors": TABLES.replace('role="output")', 'role="output", dtype="float32")')},
        "a rotary op's outputs have the I/O dtype",
    ),
]


@pytest.mark.parametrize(
    "overrides,fragment", STRUCTURE_CASES, ids=[f.split(":")[0][:40] for _, f in STRUCTURE_CASES]
)
def test_bad_structure_message(ops_dir, overrides, fragment):
    fields = {"tensors": TABLES, "params": "[]", "structure": ROTARY, "inplace": "{}"} | overrides
    (ops_dir / "bad.py").write_text(STRUCTURES.format(**fields))
    with pytest.raises(KgenError) as info:
        load_spec("bad")
    assert fragment in str(info.value)


def test_the_good_rotary_spec_loads(ops_dir):
    (ops_dir / "bad.py").write_text(
        STRUCTURES.format(tensors=TABLES, params="[]", structure=ROTARY, inplace='{"out": "x"}')
    )
    assert load_spec("bad").structure.kind == "rotary"


# A declaration in generated code: a type, then the name (loop variables included).
DECLARATION = re.compile(
    r"(?:^|[;({,]\s*|for \()\s*(?:const |constexpr |static |extern |__shared__ |__align__\(\d+\) )*"
    r"(?:auto|int|int64_t|uint32_t|uint64_t|float|bool|unsigned|Index|Access|T|TT|S|float2|char|uint4|Pack<[^>]*>|"
    r"std::\w+(?:<[^>]*>)?|torch::Tensor|c10::cuda::CUDAGuard|cudaError_t|kgen_\w+::\w+)\s*[*&]?\s+([a-z_][a-z_0-9]*)"
    r"\s*(?=[=;\[(,){]|$)",
    re.M,
)


def bodies(source: str, head: str) -> str:
    """The bodies of the functions whose definitions match ``head``, braces balanced."""
    out = []
    for m in re.finditer(head + r"[^{;]*\{", source):
        depth, i = 1, m.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(source[i], 0)
            i += 1
        out.append(source[m.end() : i])
    return "\n".join(out)


@pytest.mark.parametrize("op", op_names())
def test_generated_declarations_cannot_take_a_spec_name(op):
    """Every identifier the kernels and the binding declare where the spec's names are in scope is
    one the spec validation reserves (GENERATED_NAMES, or a name plus GENERATED_SUFFIXES): a
    template that adds a local must reserve it, or a spec using that name would not compile, or
    would silently read the local instead of its tensor."""
    spec = load_spec(op)
    files = render_target(resolve_target(op, "sm_90"))
    names = (
        {t.name for t in spec.tensors}
        | {p.name for p in spec.params}
        | {h for t in spec.tensors if t.halves for h in t.halves}
        | set(spec.structure.names())
    )
    binding = re.sub(
        r"\[[^\]]*\]\([^)]*\)", "", bodies(files["torch-ext/torch_binding.cpp"], rf"\brun_{op}\(")
    )
    while re.search(
        r"\{[^{}]*\}", binding
    ):  # the binding's inner blocks and lambdas name no spec tensor they
        binding = re.sub(r"\{[^{}]*\}", ";", binding)  # might shadow: only its outermost declarations count
    declared = set(DECLARATION.findall(binding))
    if spec.structure.kind != "rotary":  # rotary kernels reach tensors through args.<name> only
        declared |= set(DECLARATION.findall(bodies(files[f"{op}_cuda/{op}.cu"], r"__global__")))
    reserved = GENERATED_NAMES | spec.structure.declares | BUILTIN_SYMBOLS
    derived = {d for d in declared for n in names if d.startswith(n) and d.endswith(GENERATED_SUFFIXES)}
    assert declared, "no declarations found: the pattern no longer matches the generated code"
    loose = sorted(declared - reserved - derived - names)
    assert not loose, (
        f"{op}: generated code declares {loose} beside the spec's names; add them to GENERATED_NAMES"
    )


SOFTMAX_LOSS = """
import sympy as sp
from kgen.dsl import *
from kgen.families.softmax_loss import *
logits = sp.Symbol("logits")
def ref(logits, label, ignore_index=-100):
    return logits.sum(-1)
spec = OpSpec(name="bad", summary="a test op", tensors={tensors}, params={params},
              structure=SoftmaxLoss(logit={logit}, conventions=[
                  Convention(name="plain", matches="-", outputs={{"loss": lse - picked}})]),
              reference=ref)
"""
LOSS_TENSORS = (
    '[Tensor(name="logits", dims="*rows hidden"), Tensor(name="label", dims="*rows", dtype="int64"), '
    'Tensor(name="loss", dims="*rows", role="output", dtype="float32")]'
)


@pytest.mark.parametrize(
    "tensors, params, logit, fragment",
    [
        (LOSS_TENSORS, "[]", "logits", "needs the integer param 'ignore_index'"),
        (LOSS_TENSORS, '[Param(name="ignore_index", default=-100)]', "logits", "needs the integer param"),
        (
            LOSS_TENSORS.replace('dtype="int64"', 'dtype="float32"'),
            '[Param(name="ignore_index", default=-100, integer=True)]',
            "logits",
            "one int64 '*rows' label",
        ),
        (
            LOSS_TENSORS.replace('dtype="float32")]', 'dtype="io")]'),
            '[Param(name="ignore_index", default=-100, integer=True)]',
            "logits",
            "one output of dims '*rows' and dtype float32",
        ),
        (
            LOSS_TENSORS,
            '[Param(name="ignore_index", default=-100, integer=True)]',
            "sp.Symbol('y') * logits",
            "structure.logit: unknown symbols ['y']",
        ),
    ],
)
def test_softmax_loss_errors(ops_dir, tensors, params, logit, fragment):
    (ops_dir / "bad.py").write_text(SOFTMAX_LOSS.format(tensors=tensors, params=params, logit=logit))
    with pytest.raises(KgenError, match=re.escape(fragment)):
        load_spec("bad")


ELEMENTWISE_SHIFT = STRUCTURES.format(
    tensors='[Tensor(name="x", dims="*rows hidden"), Tensor(name="out", dims="*rows hidden", role="output")]',
    params='[Param(name="shift", default=0.5)]',
    structure='Elementwise(conventions=[Convention(name="plain", matches="-", outputs={"out": x + '
    'sp.Symbol("shift")})])',
    inplace="{}",
)
ROTARY_SCALE = STRUCTURES.format(
    tensors=TABLES,
    params='[Param(name="scale", default=2.0)]',
    structure=ROTARY.replace('{"out": x * cos', '{"out": sp.Symbol("scale") * x * cos'),
    inplace="{}",
)
LOSS_IGNORE = SOFTMAX_LOSS.format(
    tensors=LOSS_TENSORS, params='[Param(name="ignore_index", default=-100, integer=True)]', logit="logits"
)


@pytest.mark.parametrize(
    "source, described",
    [
        # a row reduction (and its backward, a column reduction)
        (textwrap.dedent(TEMPLATE.format(**GOOD)), "eps: a float (default 1e-06)"),
        (ELEMENTWISE_SHIFT, "shift: a float (default 0.5)"),
        (ROTARY_SCALE, "scale: a float (default 2.0)"),
        (LOSS_IGNORE, "ignore_index: an int (default -100)"),
    ],
    ids=["row_reduce", "elementwise", "rotary", "softmax_loss"],
)
def test_a_param_without_doc_renders_no_empty_comment(ops_dir, source, described):
    """A param's kernel field had an empty `// ` comment, its docstring line no description."""
    (ops_dir / "bad.py").write_text(source)
    files = render_target(resolve_target("bad", "sm_90"))
    empty = [line for text in files.values() for line in text.splitlines() if re.search(r";\s*//\s*$", line)]
    assert not empty and any(f.endswith(".cu") for f in files)
    docstring = files["torch-ext/bad_sm90/__init__.py"]
    assert f"\n        {described}\n" in docstring, docstring
