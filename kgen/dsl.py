"""The op-spec DSL: what an op computes, never how it is scheduled.

An op spec (one module in ops/) declares its tensors, scalar params, the math as
sympy expressions, its structure, its PyTorch reference and the layers it
replaces. Everything here is validated with pydantic when the spec module is
loaded, so a malformed spec fails with the spec, the field and what was expected.

Symbols an expression may use:
- a tensor's name stands for that tensor's element at the current position (fp32);
- a param's name stands for its value;
- ``hidden`` (the reduced size) and ``inv_hidden`` (1/hidden rounded to fp32);
- inside a reduction's ``finalize``: ``row_sum``, the sum of the summand over the row;
- every statistic of an earlier reduction (all of them in an epilogue).
"""

from __future__ import annotations

import inspect
import re
from typing import Annotated, Any, Callable, Literal

import sympy as sp
from pydantic import (BaseModel, ConfigDict, Field, PlainValidator,
                      field_validator, model_validator)

IDENTIFIER = r"^[a-z][a-z0-9_]{0,39}$"
Identifier = Annotated[str, Field(pattern=IDENTIFIER)]

hidden, inv_hidden, row_sum = sp.symbols("hidden inv_hidden row_sum")
BUILTIN_SYMBOLS = {"hidden", "inv_hidden"}


class to_io_dtype(sp.Function):
    """Round an fp32 value to the op's I/O dtype and back: an intermediate rounding
    that a library performs (e.g. transformers casts before the weight multiply)."""

    nargs = 1


def _sympy_expr(value: Any) -> sp.Expr:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return sp.sympify(value)
    if not isinstance(value, sp.Expr):
        raise ValueError(f"expected a sympy expression, got {type(value).__name__}")
    return value


SympyExpr = Annotated[sp.Expr, PlainValidator(_sympy_expr)]

_DIMS = re.compile(r"^(\*rows )?hidden$")


class Tensor(BaseModel):
    """A tensor argument or result. ``dims`` is ``"*rows hidden"`` (any number of
    leading dims, reduced over the last) or ``"hidden"`` (one value per column)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: Identifier
    dims: str
    role: Literal["input", "output"] = "input"
    dtype: Literal["io"] = "io"  # the op's I/O dtype: float32, float16 or bfloat16
    optional: bool = False
    absent_value: float | None = None  # the element value used when an optional input is None
    doc: str = ""

    @field_validator("dims")
    @classmethod
    def _dims(cls, dims: str) -> str:
        if not _DIMS.match(dims):
            raise ValueError(f"dims must be '*rows hidden' or 'hidden', got {dims!r}")
        return dims

    @model_validator(mode="after")
    def _optional(self) -> Tensor:
        if self.optional and self.absent_value is None:
            raise ValueError(f"optional tensor {self.name!r} needs absent_value (its element value when None)")
        if self.optional and self.role == "output":
            raise ValueError(f"output {self.name!r} cannot be optional")
        return self

    @property
    def per_row(self) -> bool:
        return self.dims.startswith("*rows")


class Param(BaseModel):
    """A float scalar param with its default. ``positive`` makes the binding refuse values <= 0."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: Identifier
    default: float
    positive: bool = False
    doc: str = ""


class Reduction(BaseModel):
    """``stat = finalize(row_sum)`` where ``row_sum`` is the fp32 sum of ``summand`` over the row."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)
    stat: Identifier
    summand: SympyExpr
    finalize: SympyExpr


class Convention(BaseModel):
    """One numerics convention: the epilogue expression of every output, and whom it matches."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)
    name: Identifier
    matches: str
    outputs: dict[str, SympyExpr]


class RowReduce(BaseModel):
    """An optional prologue (per-element values computed from the '*rows hidden' inputs, kept on
    chip in the I/O dtype in their place, e.g. r = x + residual), reductions over the last dim (in
    order; a later one may use earlier stats), then an elementwise epilogue per convention. The
    first convention is the default."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)
    kind: Literal["row_reduce"] = "row_reduce"
    prologue: dict[str, SympyExpr] = {}
    reductions: list[Reduction] = Field(min_length=1)
    conventions: list[Convention] = Field(min_length=1)


_ATTRIBUTE = re.compile(r"^(self\.)?[a-z_][a-z0-9_]*$")


class Layer(BaseModel):
    """A `kernels` layer: a stateless nn.Module whose forward replaces ``replaces``.
    ``bind`` maps each op argument to a forward argument or an attribute of the
    replaced module (``self.weight``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: Annotated[str, Field(pattern=r"^[A-Z][A-Za-z0-9]{0,39}$")]
    replaces: list[str] = Field(min_length=1)
    forward_args: list[Identifier] = Field(min_length=1)
    bind: dict[str, str]
    convention: Identifier

    @field_validator("bind")
    @classmethod
    def _bind(cls, bind: dict[str, str]) -> dict[str, str]:
        for arg, source in bind.items():
            if not _ATTRIBUTE.match(source):
                raise ValueError(f"bind[{arg!r}] must be a forward argument or 'self.<attribute>', got {source!r}")
        return bind


class OpSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)
    name: Identifier
    summary: str = Field(min_length=1)
    tensors: list[Tensor] = Field(min_length=2)
    params: list[Param] = []
    structure: RowReduce
    reference: Callable[..., Any]
    layers: list[Layer] = []
    # Implementations users run today, called like the op (inputs, then params): the benchmark's
    # peers. The first is also timed under torch.compile.
    peers: dict[str, Callable[..., Any]] = {}

    @model_validator(mode="after")
    def _consistent(self) -> OpSpec:
        names = [t.name for t in self.tensors] + [p.name for p in self.params]
        stats = [r.stat for r in self.structure.reductions]
        values = list(self.structure.prologue)
        outputs_ = {t.name for t in self.tensors if t.role == "output"}
        names += [v for v in values if v not in outputs_]  # a prologue value may be written as an output
        dupes = {n for n in names + stats if (names + stats).count(n) > 1}
        if dupes:
            raise ValueError(f"names must be unique across tensors, params and stats; repeated: {sorted(dupes)}")
        clash = (set(names) | set(stats)) & (BUILTIN_SYMBOLS | {"row_sum"})
        if clash:
            raise ValueError(f"names {sorted(clash)} are reserved for kgen's own symbols")
        row_inputs = [t for t in self.tensors if t.role == "input" and t.per_row]
        if not row_inputs or row_inputs[0].name != "x":
            raise ValueError("a row_reduce op's first '*rows hidden' input must be named 'x' "
                             "(the tensor whose dtype, device and shape the op follows)")
        flags = [t.optional for t in self.tensors if t.role == "input"]
        if flags != sorted(flags):
            raise ValueError("optional inputs must come after every required input (Python signature order)")
        ref_params = inspect.signature(self.reference).parameters
        if len(self.structure.conventions) > 1 and "convention" not in ref_params:
            raise ValueError("reference must take a `convention` argument (the op has several conventions)")
        outputs = {t.name for t in self.tensors if t.role == "output"}
        if not outputs or any(not t.per_row for t in self.tensors if t.role == "output"):
            raise ValueError("a row_reduce op needs '*rows hidden' outputs only, and at least one")

        row_inputs = {t.name for t in self.tensors if t.role == "input" and t.per_row}
        columns = {t.name for t in self.tensors if t.role == "input" and not t.per_row}
        params = {p.name for p in self.params}
        known = set(params) | BUILTIN_SYMBOLS
        for name, expr in self.structure.prologue.items():
            _check_symbols(expr, row_inputs | known, f"structure.prologue.{name}")
        row_values = set(values) or row_inputs  # what the later passes read from the row
        inputs = row_values | columns
        for i, red in enumerate(self.structure.reductions):
            _check_symbols(red.summand, row_values | known, f"structure.reductions.{i}.summand")
            _check_symbols(red.finalize, known | {"row_sum"}, f"structure.reductions.{i}.finalize")
            known.add(red.stat)
        seen = set()
        for i, conv in enumerate(self.structure.conventions):
            if conv.name in seen:
                raise ValueError(f"structure.conventions.{i}.name: {conv.name!r} is repeated")
            seen.add(conv.name)
            if set(conv.outputs) != outputs:
                raise ValueError(f"structure.conventions.{i}.outputs: expected one expression for each of "
                                 f"{sorted(outputs)}, got {sorted(conv.outputs)}")
            for out, expr in conv.outputs.items():
                _check_symbols(expr, inputs | known, f"structure.conventions.{i}.outputs.{out}")
        op_args = inputs | params
        for i, layer in enumerate(self.layers):
            if layer.convention not in seen:
                raise ValueError(f"layers.{i}.convention: {layer.convention!r} is not one of {sorted(seen)}")
            required = {t.name for t in self.tensors if t.role == "input"}
            if not required <= set(layer.bind) or not set(layer.bind) <= op_args:
                raise ValueError(f"layers.{i}.bind: expected keys {sorted(op_args)} (every input), "
                                 f"got {sorted(layer.bind)}")
        return self

    # -- views the other rooms read ------------------------------------------------------------
    @property
    def inputs(self) -> list[Tensor]:
        return [t for t in self.tensors if t.role == "input"]

    @property
    def row_inputs(self) -> list[Tensor]:
        return [t for t in self.inputs if t.per_row]

    @property
    def column_inputs(self) -> list[Tensor]:
        return [t for t in self.inputs if not t.per_row]

    @property
    def outputs(self) -> list[Tensor]:
        return [t for t in self.tensors if t.role == "output"]

    @property
    def row_values(self) -> list[str]:
        """The per-element values kept on chip: the prologue's, else the row inputs."""
        return list(self.structure.prologue) or [t.name for t in self.row_inputs]

    @property
    def default_convention(self) -> str:
        return self.structure.conventions[0].name


def _check_symbols(expr: sp.Expr, allowed: set[str], where: str) -> None:
    unknown = sorted(str(s) for s in expr.free_symbols if str(s) not in allowed)
    if unknown:
        raise ValueError(f"{where}: unknown symbols {unknown}; allowed here: {sorted(allowed)}")
    funcs = {type(f).__name__ for f in expr.atoms(sp.Function)} - SUPPORTED_FUNCTIONS
    if funcs:
        raise ValueError(f"{where}: functions {sorted(funcs)} have no CUDA printing; "
                         f"supported: {sorted(SUPPORTED_FUNCTIONS)}")


SUPPORTED_FUNCTIONS = {"to_io_dtype", "exp", "log", "tanh", "erf", "sqrt", "Abs", "Max", "Min"}
