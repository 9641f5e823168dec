"""The op-spec DSL: what an op computes, never how it is scheduled.

An op spec (one module in ops/) declares its tensors, scalar params, the math as sympy expressions, its
structure, its PyTorch reference and the layers it replaces. This module holds what every spec shares; each
structure kind (row reduction, elementwise, rotary, ...) is a `Structure` defined by its family in
kgen/families/, which adds its own fields, symbols and rules. Everything is validated with pydantic when the
spec module is loaded, so a malformed spec fails with the spec, the field and what was expected.

Symbols every expression may use:
- a tensor's name stands for that tensor's element at the current position (fp32);
- a param's name stands for its value;
- a packed input's two halves, by the names in its ``halves``;
- ``hidden`` (the last dim of the outputs) and ``inv_hidden`` (1/hidden rounded to fp32);
and those its structure adds (a reduction's statistics, a rotary pair's cos and sin, ...).
"""

from __future__ import annotations

import builtins
import dis
import inspect
import keyword
import re
from typing import Annotated, Any, Callable, ClassVar, Literal

import sympy as sp
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    StrictBool,
    StrictInt,
    model_validator,
)

IDENTIFIER = r"^[a-z][a-z0-9_]{0,39}$"
DOTTED_PATH = (
    r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$"  # a module's class: transformers.x.LlamaRMSNorm
)
CPP_KEYWORDS = set(
    """alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t char32_t
class compl concept const consteval constexpr constinit const_cast continue co_await co_return co_yield
decltype default delete do double dynamic_cast else enum explicit export extern false float for friend
goto if inline int long mutable namespace new noexcept not not_eq nullptr operator or or_eq private
protected public register reinterpret_cast requires return short signed sizeof static static_assert
static_cast struct switch template this thread_local throw true try typedef typeid typename union
unsigned using virtual void volatile wchar_t while xor xor_eq""".split()
)


def _check(ok: Callable[[Any], Any], why: str) -> AfterValidator:
    """A field constraint: the value if ok(value), else the field's error 'must be <why>' (pydantic adds
    the value)."""

    def check(value):
        if not ok(value):
            raise ValueError(f"must be {why}")
        return value

    return AfterValidator(check)


# names become C++ and Python identifiers, and the op's name its file and folder names
Identifier = Annotated[
    str,
    Field(pattern=IDENTIFIER),
    _check(
        lambda v: not keyword.iskeyword(v) and v not in CPP_KEYWORDS,
        "a name that is no Python or C++ keyword",
    ),
]
# Free text goes into C++ // comments, Python docstrings, CARD.md and (escaped) flake.nix: one printable line
# (no control, bidi or line-separator characters) without escapes or line splices, comment or docstring ends
Text = Annotated[
    str,
    _check(
        lambda v: v.isprintable() and not re.search(r"\\|\*/|\"\"\"|'''|\?\?/", v),
        "one printable line without a backslash, '*/', '\"\"\"', \"'''\" or '??/'",
    ),
]
# printed as a Python and C++ literal; strict: True or "0.01" is refused, not read as 1.0 or 0.01
FiniteFloat = Annotated[float, Field(allow_inf_nan=False, strict=True)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)


hidden, inv_hidden = sp.symbols("hidden inv_hidden")
BUILTIN_SYMBOLS = {"hidden", "inv_hidden"}
# What the project templates (binding, Python wrapper, CUDA helpers) declare beside the spec's names, found by
# compiling probe specs; each family adds its kernels' own (Structure.declares). These would not compile, or
# would shadow the spec's tensor.
GENERATED_NAMES = {
    "op",
    "dtype",
    "convention",
    "inplace",
    "params",
    "args",
    "out_shape",
    "guard",
    "err",
    "check_device",
    "io_dtype",
    "shape_str",
    "number_str",
    "device_plans",
    "plans_for",
    "pack",
    "to_float",
    "from_float",
    "ceil_div",
    "aligned",
    "round_to_io",
    "to_pair",
    "torch",
    "ops",
    "list",
    "self",
}
# the suffixes of each tensor's own locals in generated code (x_rows, x_row_stride, x4)
GENERATED_SUFFIXES = (
    "_row",
    "_rows",
    "_col",
    "_in",
    "_f",
    "_v",
    "_regs",
    "_shared",
    "_pair",
    "_heads",
    "3",
    "4",
    "_stride",
    "_dense",
)


class sigmoid(sp.Function):
    """The logistic function 1 / (1 + exp(-u)), with its derivative s·(1 - s): the form a gradient stays
    finite in (the derivative of 1 / (1 + exp(-u)) written with exp overflows to inf / inf for u < -88 in
    fp32)."""

    nargs = 1

    def fdiff(self, argindex=1):
        return self * (1 - self)


class to_io_dtype(sp.Function):
    """Round an fp32 value to the op's I/O dtype and back: an intermediate rounding
    that a library performs (e.g. transformers casts before the weight multiply). It differentiates as the
    identity, as autograd treats a cast, while its value stays rounded where a derivative keeps it
    (∂(w·to_io_dtype(u))/∂w = to_io_dtype(u): the rounded tensor the library saves for its backward)."""

    nargs = 1

    def fdiff(self, argindex=1):
        return sp.S.One


def _sympy_expr(value: Any) -> sp.Expr:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return sp.sympify(value)
    if not isinstance(value, sp.Expr):
        raise ValueError(f"expected a sympy expression, got {type(value).__name__}")
    return value


SympyExpr = Annotated[sp.Expr, PlainValidator(_sympy_expr)]


class Tensor(_Model):
    """A tensor argument or result. ``dims`` says how it lines up with the op's work: ``"*rows hidden"``
    (any number of leading dims, the op working along the last), ``"hidden"`` (one value per column, e.g. a
    weight), ``"*rows 2*hidden"`` (a packed input: two halves along the last dim, named by ``halves``, e.g.
    GEGLU's hidden and gate), or another layout its structure's family defines. ``broadcast`` lets a '*rows
    hidden' input broadcast over the lead tensor's leading dims (e.g. a per-batch [B, 1, C] modulation
    beside a [B, S, C] x)."""

    name: Identifier
    dims: Annotated[str, Field(pattern=r"^[a-z0-9*]+( [a-z0-9*]+)*$")]
    role: Literal["input", "output"] = "input"
    # io: the op's I/O dtype (float32, float16 or bfloat16); float32 whatever it is (an output: in the row
    # families only, e.g. the gradient of a float32 input); int64: an input of indices (a class label), in
    # the families that take one (Structure.int_inputs)
    dtype: Literal["io", "float32", "int64"] = "io"
    optional: bool = False
    absent_value: FiniteFloat | None = None  # the element value used when an optional input is None
    halves: tuple[Identifier, Identifier] | None = None
    broadcast: bool = False
    doc: Text = ""

    @model_validator(mode="after")
    def _consistent(self) -> Tensor:
        if self.optional and self.absent_value is None:
            raise ValueError(
                f"optional tensor {self.name!r} needs absent_value (its element value when None)"
            )
        if self.dtype == "int64" and (self.role == "output" or self.optional):
            raise ValueError(f"tensor {self.name!r}: an int64 tensor is a required input (indices)")
        if self.optional and self.role == "output":
            raise ValueError(f"output {self.name!r} cannot be optional")
        if (self.halves is not None) != self.packed:
            raise ValueError(
                f"tensor {self.name!r} (dims {self.dims!r}): 'halves' names the two halves of a "
                "'*rows 2*hidden' input, and such an input needs them"
            )
        if self.packed and self.optional:
            raise ValueError(f"packed tensor {self.name!r} cannot be optional")
        if self.broadcast and (self.dims != "*rows hidden" or self.role == "output"):
            raise ValueError(f"tensor {self.name!r}: only a '*rows hidden' input can broadcast")
        return self

    @property
    def packed(self) -> bool:
        return self.dims == "*rows 2*hidden"

    @property
    def per_row(self) -> bool:
        """Leading dims that follow the lead tensor's: '*rows ...'."""
        return self.dims.startswith("*rows")

    @property
    def column(self) -> bool:
        """One value per column: 'hidden'."""
        return self.dims == "hidden"


class Param(_Model):
    """A scalar param with its default: a float, or an int with ``integer``. ``positive`` makes the
    binding refuse values <= 0."""

    name: Identifier
    default: FiniteFloat  # held as an int for integer params (below)
    positive: bool = False
    integer: bool = False
    doc: Text = ""

    @model_validator(mode="after")
    def _integer(self) -> Param:
        if self.integer and self.default != int(self.default):
            raise ValueError(f"integer param {self.name!r} needs an integer default, got {self.default}")
        # the default as the binding's schema takes it (an int param refuses -100.0)
        object.__setattr__(self, "default", int(self.default) if self.integer else float(self.default))
        if self.positive and not self.default > 0:
            raise ValueError(f"param {self.name!r} is positive: its default must be > 0, got {self.default}")
        return self


class Convention(_Model):
    """One numerics convention: the expression of every output, and whom it matches. ``prologue`` replaces
    the structure's prologue expressions where a library rounds differently on the way in (structures with
    one)."""

    name: Identifier
    matches: Text
    outputs: dict[Identifier, SympyExpr]
    prologue: dict[Identifier, SympyExpr] = {}


class Structure(_Model):
    """The base of every structure kind: how the op's elements relate (a row reduction, elementwise, a
    pairwise rotation, ...). A family module in kgen/families/ (or on $KGEN_FAMILIES_PATH) defines a
    subclass with its own fields and rules, and plans and renders it. The first convention is the default."""

    kind: str
    conventions: list[Convention] = Field(min_length=1)

    dims: ClassVar[tuple[str, ...]] = ("*rows hidden", "hidden")  # the tensor layouts this kind takes
    declares: ClassVar[frozenset[str]] = (
        frozenset()
    )  # identifiers its templates declare beside the spec's names
    column_outputs: ClassVar[tuple[str, ...]] = ()  # the dims of outputs summed over the rows, if it has any
    row_output_dims: ClassVar[tuple[str, ...]] = ("*rows hidden", "*rows 2*hidden")  # its per-row outputs'
    int_inputs: ClassVar[bool] = False  # whether it takes int64 inputs

    def convention(self, name: str) -> Convention:
        return next(c for c in self.conventions if c.name == name)

    def assigned(self, spec: OpSpec) -> list[str]:
        """What each convention assigns an expression: every output (a packed one's halves)."""
        return spec.output_values

    def names(self) -> list[str]:
        """Names the structure introduces beside the spec's tensors and params (a reduction's statistics,
        ...)."""
        return []

    def check(self, spec: OpSpec) -> set[str]:
        """The kind's rules, raising ValueError; returns the symbols (beyond params and builtins) that the
        conventions' output expressions may use."""
        raise NotImplementedError


class Layer(_Model):
    """A `kernels` layer: a stateless nn.Module whose forward replaces ``replaces``. ``bind`` maps each op
    argument to a forward argument, an attribute of the replaced module (``self.weight``) or a submodule
    applied to a forward argument (``self.gate_proj(x)``); ``returns`` is a submodule the op's output goes
    through (``self.down_proj``); ``condition`` (the replaced module -> bool) picks the instances whose
    forward the layer computes. A forward argument no op argument is bound to has a value in ``defaults``
    (as the replaced forward), and the layer computes that value only: another raises. ``replaces`` may
    name a function kernels turns into a module (rotary)."""

    name: Annotated[str, Field(pattern=r"^[A-Z][A-Za-z0-9]{0,39}$")]
    replaces: list[Annotated[str, Field(pattern=DOTTED_PATH)]] = Field(min_length=1)
    forward_args: list[Identifier] = Field(min_length=1)
    bind: dict[
        str,
        Annotated[
            str,
            _check(
                re.compile(r"(self\.)?[a-z_][a-z0-9_]*|self\.[a-z_][a-z0-9_]*\([a-z_][a-z0-9_]*\)").fullmatch,
                "a forward argument, 'self.<attribute>' or 'self.<submodule>(<forward argument>)'",
            ),
        ],
    ]
    returns: Annotated[str, Field(pattern=r"^self\.[a-z_][a-z0-9_]*$")] | None = None
    condition: Callable[[Any], bool] | None = None
    defaults: dict[Identifier, StrictBool | StrictInt] = {}
    convention: Identifier


class OpSpec(_Model):
    name: Identifier
    summary: Text = Field(min_length=1)
    tensors: list[Tensor] = Field(min_length=2)
    params: list[Param] = []
    structure: Structure
    reference: Callable[..., Any]
    layers: list[Layer] = []
    # Implementations users run today, called like the op (inputs, then params): the benchmark's
    # peers. The first is also timed under torch.compile. Names head bench's Markdown tables and plot legends.
    peers: dict[Annotated[Text, Field(pattern=r"^[^|$\[]+$")], Callable[..., Any]] = {}
    # output -> the input it overwrites in the op's in-place form `<op>_` (which returns the other
    # outputs), e.g. {"residual_out": "residual"}
    inplace: dict[Identifier, Identifier] = {}
    # a derived backward's gradients it writes once for several inputs: {grad_residual: grad_x} (fused add +
    # RMSNorm: x's and residual's are the same tensor, handed to both)
    shared: dict[Identifier, Identifier] = {}
    # a derived backward's output equal to an incoming gradient, {grad_shift: grad_out}: see ColumnReduce
    passes: dict[Identifier, Identifier] = {}

    @model_validator(mode="after")
    def _consistent(self) -> OpSpec:
        structure = self.structure
        for i, t in enumerate(self.tensors):
            if t.dims not in structure.dims:
                raise ValueError(
                    f"tensors.{i}.dims: {structure.kind} ops take tensors of dims "
                    f"{' or '.join(map(repr, structure.dims))}, got {t.dims!r}"
                )
        halves = [h for t in self.tensors if t.halves for h in t.halves]
        outputs = {t.name for t in self.outputs}
        values = set(structure.assigned(self))
        names = [t.name for t in self.tensors] + [p.name for p in self.params] + halves
        names += [n for n in structure.names() if n not in outputs]  # a structure's value may be written out
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise ValueError(
                "names must be unique across tensors, halves, params and the structure's values; "
                f"repeated: {sorted(dupes)}"
            )
        clash = set(names) & (BUILTIN_SYMBOLS | GENERATED_NAMES | structure.declares)
        clash |= {
            n for n in names for m in names if n != m and n.startswith(m) and n.endswith(GENERATED_SUFFIXES)
        }
        if clash:
            raise ValueError(
                f"names {sorted(clash)} are reserved for kgen's own symbols (identifiers of the "
                "generated code, or another name plus a suffix the generated code appends)"
            )
        lead = next((t for t in self.inputs if t.per_row), None)
        if lead is None or lead.broadcast or lead.optional or lead.dtype != "io":
            raise ValueError(
                "an op's first '*rows ...' input leads (the op follows its dtype, device and leading "
                "dims): there must be one, required, in the I/O dtype and not broadcast"
            )
        flags = [t.optional for t in self.inputs]
        if flags != sorted(flags):
            raise ValueError("optional inputs must come after every required input (Python signature order)")
        row_outputs = [t for t in self.outputs if t.dims in structure.row_output_dims]
        if not row_outputs or any(
            t not in row_outputs and t.dims not in structure.column_outputs for t in self.outputs
        ):
            summed = " or ".join(map(repr, structure.column_outputs))
            raise ValueError(
                f"an op needs {' or '.join(map(repr, structure.row_output_dims))} outputs, at least one"
                + (f", and {summed} outputs (summed over the rows)" if summed else " only")
            )
        if not structure.int_inputs and (ints := [t.name for t in self.tensors if t.dtype == "int64"]):
            raise ValueError(f"{ints}: {structure.kind} ops take no int64 tensors")
        self._check_reference()
        symbols = structure.check(self) | {p.name for p in self.params} | BUILTIN_SYMBOLS
        seen = set()
        for i, conv in enumerate(structure.conventions):
            if conv.name in seen:
                raise ValueError(f"structure.conventions.{i}.name: {conv.name!r} is repeated")
            seen.add(conv.name)
            if set(conv.outputs) != values:
                raise ValueError(
                    f"structure.conventions.{i}.outputs: expected one expression for each of "
                    f"{sorted(values)} (a packed output's halves), got {sorted(conv.outputs)}"
                )
            for out, expr in conv.outputs.items():
                check_symbols(expr, symbols, f"structure.conventions.{i}.outputs.{out}")
        overwritable = {
            t.name
            for t in self.row_inputs
            if t.dims == "*rows hidden" and t.dtype == "io" and not (t.broadcast or t.optional)
        }
        if (
            not set(self.inplace) <= {t.name for t in self.outputs if not t.packed}
            or not set(self.inplace.values()) <= overwritable
        ):
            raise ValueError(
                f"inplace: maps outputs {sorted(outputs)} to the inputs they overwrite, required "
                f"'*rows hidden' inputs of the same shape {sorted(overwritable)}; got {self.inplace}"
            )
        if not set(self.shared.values()) <= outputs or set(self.shared) & set(names):
            raise ValueError(f"shared: maps new names to outputs {sorted(outputs)}; got {self.shared}")
        if not set(self.passes) <= outputs or not set(self.passes.values()) <= {t.name for t in self.inputs}:
            raise ValueError(f"passes: maps outputs {sorted(outputs)} to inputs; got {self.passes}")
        self._check_layers(seen)
        return self

    def unused_params(self) -> list[str]:
        """The params nothing reads: no expression of the structure (its conventions' math, its reductions',
        angles', ...), none of its fields by name (a grid's sizes), no rule of its family (a softmax loss's
        ignore_index, without which its check refuses the spec). The loader refuses a spec with one; a derived
        backward may have some (a gradient free of a param)."""
        mentioned = _mentions(self.structure)

        def required(param: Param) -> bool:
            try:
                self.structure.check(
                    self.model_copy(update={"params": [p for p in self.params if p.name != param.name]})
                )
            except ValueError:
                return True
            return False

        return [p.name for p in self.params if p.name not in mentioned and not required(p)]

    def _check_reference(self) -> None:
        copied = [self.reference, *reference_helpers(self.reference)]
        foreign = (
            set().union(*(_global_names(f.__code__) for f in copied))
            - REFERENCE_GLOBALS
            - set(dir(builtins))
            - {f.__name__ for f in copied}
        )
        if foreign:
            raise ValueError(
                f"reference uses {sorted(foreign)} from its module; a generated project's test "
                f"copies the reference and the functions it calls, with {sorted(REFERENCE_GLOBALS)} "
                "imported"
            )
        signature = inspect.signature(self.reference)
        if len(self.structure.conventions) > 1 and "convention" not in signature.parameters:
            raise ValueError("reference must take a `convention` argument (the op has several conventions)")
        # called as reference(*inputs, *params) (bench, tests) and reference(*inputs, **params) (project
        # tests)
        inputs, params = [t.name for t in self.inputs], {p.name: p.default for p in self.params}
        for shown, args, kwargs in [
            (", ".join(inputs + list(params)), inputs + list(params.values()), {}),
            (", ".join(inputs + [f"{p}=..." for p in params]), inputs, params),
        ]:
            try:
                signature.bind(*args, **kwargs)
            except TypeError as err:
                raise ValueError(
                    f"reference{signature} cannot be called as {self.reference.__name__}({shown}) with the "
                    f"spec's inputs and params: {err}"
                ) from None

    def _check_layers(self, conventions: set[str]) -> None:
        required = {t.name for t in self.inputs}
        op_args = required | {p.name for p in self.params}
        for i, layer in enumerate(self.layers):
            if layer.convention not in conventions:
                raise ValueError(
                    f"layers.{i}.convention: {layer.convention!r} is not one of {sorted(conventions)}"
                )
            if not required <= set(layer.bind) or not set(layer.bind) <= op_args:
                raise ValueError(
                    f"layers.{i}.bind: expected keys {sorted(op_args)} (every input), "
                    f"got {sorted(layer.bind)}"
                )
            args = {
                re.sub(r"^self\.\w+\((\w+)\)$", r"\1", v)
                for v in layer.bind.values()
                if "self." not in v or "(" in v
            }
            if not args <= set(layer.forward_args):
                raise ValueError(
                    f"layers.{i}.bind: {sorted(args - set(layer.forward_args))} are not forward "
                    f"arguments {layer.forward_args}"
                )
            tail = layer.forward_args[len(layer.forward_args) - len(layer.defaults) :]
            if set(layer.forward_args) - args - set(layer.defaults) or set(layer.defaults) != set(tail):
                raise ValueError(
                    f"layers.{i}.defaults: every forward argument no op argument is bound to needs "
                    f"one, and they are the last arguments; got {layer.defaults} for "
                    f"{layer.forward_args}"
                )

    # -- views the other rooms read ------------------------------------------------------------
    @property
    def inputs(self) -> list[Tensor]:
        return [t for t in self.tensors if t.role == "input"]

    @property
    def outputs(self) -> list[Tensor]:
        return [t for t in self.tensors if t.role == "output"]

    @property
    def output_values(self) -> list[str]:
        """What the conventions assign: each output, or a packed output's two halves."""
        return [v for t in self.outputs for v in (t.halves or (t.name,))]

    @property
    def row_inputs(self) -> list[Tensor]:
        """The inputs with leading dims ('*rows ...'), the lead first."""
        return [t for t in self.inputs if t.per_row]

    @property
    def column_inputs(self) -> list[Tensor]:
        return [t for t in self.inputs if t.column]

    @property
    def row_outputs(self) -> list[Tensor]:
        return [t for t in self.outputs if t.per_row]

    @property
    def column_outputs(self) -> list[Tensor]:
        """'hidden' outputs: sums over the rows (a structure with ``column_outputs``)."""
        return [t for t in self.outputs if t.column]

    @property
    def lead(self) -> Tensor:
        """The first '*rows ...' input: the op follows its dtype, device and leading dims."""
        return self.row_inputs[0]

    @property
    def default_convention(self) -> str:
        return self.structure.conventions[0].name

    def variant(self, convention: str, inplace: bool = False) -> str:
        """The name of the op registered for a convention: the op's own for the default,
        `<op>_<convention>` for the others; `_` appended for the in-place form."""
        names = [c.name for c in self.structure.conventions]
        if convention not in names:
            raise ValueError(f"{self.name}: convention must be one of {names}, got {convention!r}")
        return self.name + ("" if convention == names[0] else f"_{convention}") + ("_" if inplace else "")


def reference_helpers(fn, seen: tuple = ()) -> list[Callable]:
    """The module-level functions a reference calls (and they call), dependencies first: the
    generated project's test copies them with it."""
    out = []
    for name in sorted(_global_names(fn.__code__)):
        helper = fn.__globals__.get(name)
        if inspect.isfunction(helper) and helper.__name__ == name and helper not in seen and helper is not fn:
            out += [h for h in reference_helpers(helper, (*seen, fn)) if h not in out] + [helper]
    return list(dict.fromkeys(out))


def _global_names(code) -> set[str]:
    """The module-level names a function (and the functions nested in it) reads."""
    names = {i.argval for i in dis.get_instructions(code) if i.opname == "LOAD_GLOBAL"}
    for const in code.co_consts:
        if inspect.iscode(const):
            names |= _global_names(const)
    return names


def _mentions(value: Any) -> set[str]:
    """The names a structure's value reads: its expressions' symbols and (but a convention's text) its
    strings, through models, dicts and lists."""
    if isinstance(value, sp.Basic):
        return {str(s) for s in value.free_symbols}
    if isinstance(value, str):
        return {value}
    if isinstance(value, Convention):
        value = [value.outputs, value.prologue]
    elif isinstance(value, BaseModel):
        value = [getattr(value, f) for f in type(value).model_fields]
    elif isinstance(value, dict):
        value = [*value.keys(), *value.values()]
    elif not isinstance(value, (list, tuple)):
        return set()
    return set().union(*map(_mentions, value))


def check_symbols(expr: sp.Expr, allowed: set[str], where: str, rounds: bool = True) -> None:
    """Refuses symbols outside ``allowed`` and functions with no CUDA printing (by class: an undefined
    sp.Function("tanh") is not sympy's tanh). ``rounds``: to_io_dtype may appear (not in fp32 code with no
    I/O dtype, e.g. reductions)."""
    unknown = sorted(str(s) for s in expr.free_symbols if str(s) not in allowed)
    if unknown:
        raise ValueError(f"{where}: unknown symbols {unknown}; allowed here: {sorted(allowed)}")
    printable = {n: f for n, f in PRINTABLE.items() if rounds or f is not to_io_dtype}
    calls = {type(n) for n in sp.preorder_traversal(expr) if not isinstance(n, _NODES)}
    funcs = {f.__name__ for f in calls if printable.get(f.__name__) is not f}
    if lookalikes := sorted(funcs & set(printable)):
        name = lookalikes[0]
        origin = "kgen.dsl" if printable[name].__module__ == __name__ else "sympy"
        raise ValueError(
            f"{where}: {name} is an undefined sympy function (sp.Function({name!r})), with no CUDA printing "
            f"or derivative; use {origin}.{name}"
        )
    if funcs:
        raise ValueError(
            f"{where}: functions {sorted(funcs)} have no CUDA printing here; known: {sorted(printable)}"
        )


REFERENCE_GLOBALS = {"torch", "F", "math"}  # torch.nn.functional as F
_NODES = (
    sp.Symbol,
    sp.Number,
    sp.NumberSymbol,
    sp.Add,
    sp.Mul,
    sp.Pow,
    sp.UnevaluatedExpr,
    sp.Rel,
    sp.And,
    sp.Or,
    sp.Not,
    sp.ITE,
    sp.logic.boolalg.BooleanAtom,
    sp.functions.elementary.piecewise.ExprCondPair,
)  # and these:
# the functions with CUDA printing, by name; a node is one if its class is the one named (sqrt is named so
# an undefined sp.Function("sqrt") is told where sqrt comes from: sympy writes sp.sqrt(u) as a power)
PRINTABLE = {
    f.__name__: f
    for f in [to_io_dtype, sigmoid, sp.exp, sp.log, sp.tanh, sp.erf, sp.sqrt, sp.sin, sp.cos, sp.Abs]
    + [sp.Max, sp.Min, sp.Piecewise, sp.floor, sp.re]
}
