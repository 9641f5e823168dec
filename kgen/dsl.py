"""The op-spec DSL: what an op computes, never how it is scheduled.

An op spec (one module in ops/) declares its tensors, scalar params, the math as sympy expressions, its structure,
its PyTorch reference and the layers it replaces. Everything here is validated with pydantic when the spec module
is loaded, so a malformed spec fails with the spec, the field and what was expected.

Symbols an expression may use:
- a tensor's name stands for that tensor's element at the current position (fp32);
- a param's name stands for its value;
- a packed input's two halves, by the names in its ``halves``;
- ``hidden`` (the last dim of the outputs) and ``inv_hidden`` (1/hidden rounded to fp32);
- inside a reduction's ``finalize``: ``row_sum``, the sum of the summand over the row;
- every statistic of an earlier reduction (all of them in an epilogue).
"""

from __future__ import annotations

import builtins
import dis
import inspect
import keyword
import re
from typing import Annotated, Any, Callable, Literal

import sympy as sp
from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, PlainValidator, StrictBool, StrictInt,
                      model_validator)

IDENTIFIER = r"^[a-z][a-z0-9_]{0,39}$"
DOTTED_PATH = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$"  # a module's class: transformers.x.LlamaRMSNorm
CPP_KEYWORDS = set("""alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t
char32_t class compl concept const consteval constexpr constinit const_cast continue co_await co_return co_yield
decltype default delete do double dynamic_cast else enum explicit export extern false float for friend goto if inline
int long mutable namespace new noexcept not not_eq nullptr operator or or_eq private protected public register
reinterpret_cast requires return short signed sizeof static static_assert static_cast struct switch template this
thread_local throw true try typedef typeid typename union unsigned using virtual void volatile wchar_t while xor
xor_eq""".split())


def _check(ok: Callable[[Any], Any], why: str) -> AfterValidator:
    """A field constraint: the value if ok(value), else the field's error 'must be <why>' (pydantic adds the value)."""
    def check(value):
        if not ok(value):
            raise ValueError(f"must be {why}")
        return value
    return AfterValidator(check)


# names become C++ and Python identifiers, and the op's name its file and folder names
Identifier = Annotated[str, Field(pattern=IDENTIFIER), _check(
    lambda v: not keyword.iskeyword(v) and v not in CPP_KEYWORDS, "a name that is no Python or C++ keyword")]
# Free text goes into C++ // comments, Python docstrings, CARD.md and (escaped) flake.nix: one printable line (no
# control, bidi or line-separator characters) without escapes or line splices, comment or docstring ends
Text = Annotated[str, _check(lambda v: v.isprintable() and not re.search(r"\\|\*/|\"\"\"|'''|\?\?/", v),
                             "one printable line without a backslash, '*/', '\"\"\"', \"'''\" or '??/'")]
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]  # printed as a Python and C++ literal


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)


hidden, inv_hidden, row_sum = sp.symbols("hidden inv_hidden row_sum")
BUILTIN_SYMBOLS = {"hidden", "inv_hidden"}
# What the generated C++ declares beside the spec's names (binding locals and helpers, Args, kernel helpers; found by
# compiling probe specs) and the suffixes of each tensor's own locals (x_rows, x_row_stride, x4): these don't compile.
GENERATED_NAMES = {"op", "dtype", "convention", "inplace", "params", "args", "rows", "inner", "batch", "tokens",
                   "out_shape", "guard", "err", "as_rows", "as_broadcast_rows", "as_bhtd", "check_device", "io_dtype",
                   "shape_str", "check_capability", "accesses", "fetch", "from_global", "lane", "partial", "row",
                   "scratch", "col", "per_row", "positions", "stride", "pack", "to_float", "from_float", "load_floats",
                   "store_floats", "ceil_div", "aligned", "round_to_io", "row_reduce_sum", "for_each_access", "to_pair",
                   "torch", "ops", "list", "self", "i", "j", "g"}  # torch..self: the Python wrapper's; i, j, g: loops
GENERATED_SUFFIXES = ("_row", "_rows", "_col", "_in", "_f", "_v", "_regs", "_shared", "_pair", "_heads", "3", "4", "_stride")
# rotary: an element's pair partner is <name>_pair; sign is -1 on a pair's first element, +1 on its second
cos, sin, sign = sp.symbols("cos sin sign")
# grid angles: k (a frequency's index), n_freq (how many), coord (an axis coordinate), freq
k, n_freq, coord, freq = sp.symbols("k n_freq coord freq")


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


class Tensor(_Model):
    """A tensor argument or result. ``dims`` is ``"*rows hidden"`` (any number of leading dims,
    the op working along the last), ``"hidden"`` (one value per column) or ``"*rows 2*hidden"``
    (a packed input: two halves along the last dim, named by ``halves``, e.g. GEGLU's hidden and
    gate). ``broadcast`` lets a '*rows hidden' input broadcast over x's leading dims (e.g. a
    per-batch [B, 1, C] modulation beside a [B, S, C] x). ``"batch axes tokens"`` is a float32
    [B, axes, S] tensor of per-token grid coordinates (a rotary op's GridAngles.coordinates_input)."""

    name: Identifier
    dims: Annotated[str, _check(re.compile(r"(\*rows )?(2\*)?hidden|batch axes tokens").fullmatch,
                                "'*rows hidden', 'hidden', '*rows 2*hidden' or 'batch axes tokens'")]
    role: Literal["input", "output"] = "input"
    dtype: Literal["io", "float32"] = "io"  # io: the op's I/O dtype (float32, float16 or bfloat16)
    optional: bool = False
    absent_value: FiniteFloat | None = None  # the element value used when an optional input is None
    halves: tuple[Identifier, Identifier] | None = None
    broadcast: bool = False
    doc: Text = ""

    @model_validator(mode="after")
    def _optional(self) -> Tensor:
        if self.optional and self.absent_value is None:
            raise ValueError(f"optional tensor {self.name!r} needs absent_value (its element value when None)")
        if self.optional and self.role == "output":
            raise ValueError(f"output {self.name!r} cannot be optional")
        if (self.halves is not None) != self.packed:
            raise ValueError(f"tensor {self.name!r}: 'halves' names the two halves of a '*rows 2*hidden' "
                             "input, and such an input needs them")
        if self.packed and (self.role == "output" or self.optional):
            raise ValueError(f"packed tensor {self.name!r} must be a required input")
        if self.broadcast and (self.dims != "*rows hidden" or self.role == "output"):
            raise ValueError(f"tensor {self.name!r}: only a '*rows hidden' input can broadcast")
        if self.dtype != "io" and self.role == "output":
            raise ValueError(f"output {self.name!r} has the I/O dtype")
        if self.coordinates and (self.dtype != "float32" or self.role == "output" or self.optional):
            raise ValueError(f"tensor {self.name!r}: grid coordinates are a required float32 input")
        return self

    @property
    def packed(self) -> bool:
        return self.dims.endswith("2*hidden")

    @property
    def coordinates(self) -> bool:
        return self.dims == "batch axes tokens"

    @property
    def per_row(self) -> bool:
        return self.dims.startswith("*rows")


class Param(_Model):
    """A scalar param with its default: a float, or an int with ``integer``. ``positive`` makes the
    binding refuse values <= 0."""

    name: Identifier
    default: FiniteFloat
    positive: bool = False
    integer: bool = False
    doc: Text = ""

    @model_validator(mode="after")
    def _integer(self) -> Param:
        if self.integer and self.default != int(self.default):
            raise ValueError(f"integer param {self.name!r} needs an integer default, got {self.default}")
        return self


class Reduction(_Model):
    """``stat = finalize(row_sum)`` where ``row_sum`` is the fp32 sum of ``summand`` over the row."""

    stat: Identifier
    summand: SympyExpr
    finalize: SympyExpr


class Convention(_Model):
    """One numerics convention: the epilogue expression of every output, and whom it matches.
    ``prologue`` (row_reduce) replaces the structure's prologue expressions where a library
    rounds differently on the way in."""

    name: Identifier
    matches: Text
    outputs: dict[Identifier, SympyExpr]
    prologue: dict[Identifier, SympyExpr] = {}


class Elementwise(_Model):
    """Each output element from the inputs' elements at the same position (a packed input's
    halves at the same column), per convention. The first convention is the default."""

    kind: Literal["elementwise"] = "elementwise"
    conventions: list[Convention] = Field(min_length=1)


class GridAngles(_Model):
    """Rotary angles computed in the kernel from each token's place on a latent grid (LTX-Video's
    3D RoPE). Tokens run row-major over the integer params ``sizes``; ``axes`` name the index along
    each. The first C mod (2·axes) channels pass through (cos 1, sin 0); channel c >= that pad is in
    pair j = (c - pad) // 2, with frequency k = j // len(axes) of n_freq = C // (2·axes) and axis
    j mod len(axes). ``coordinates`` (one per axis, of its index and params), ``frequency`` (of k
    and n_freq) and ``angle`` (of freq and coord) are fp32 math."""

    axes: list[Identifier] = Field(min_length=1, max_length=3)
    sizes: list[Identifier] = Field(default=[], max_length=3)
    coordinates: list[SympyExpr]
    # a 'batch axes tokens' input giving each token's coordinates (diffusers' video_coords) instead
    # of the sizes; then ``coordinates`` map each given value (the axis symbol) to the coordinate
    coordinates_input: Identifier | None = None
    frequency: SympyExpr
    angle: SympyExpr


class Rotary(_Model):
    """Pairwise rotation of each '*rows hidden' io input (q, and optionally k) into the outputs,
    in order: pairs (2i, 2i + 1) ("interleaved", GPT-J / Flux / LTX-Video) or (i, i + D/2)
    ("half", Llama's rotate_half). cos and sin per element come from input tensors named cos and
    sin (broadcast over batch and heads), or from ``grid``. Each convention gives an output its
    element from the input's element, ``<input>_pair``, cos, sin and sign."""

    kind: Literal["rotary"] = "rotary"
    pairing: Literal["interleaved", "half"]
    grid: GridAngles | None = None
    conventions: list[Convention] = Field(min_length=1)


class RowReduce(_Model):
    """An optional prologue (per-element values computed from the '*rows hidden' inputs, kept on
    chip in the I/O dtype in their place, e.g. r = x + residual), reductions over the last dim (in
    order; a later one may use earlier stats), then an elementwise epilogue per convention. The
    first convention is the default. Row inputs that only the epilogue uses are read there, not
    kept on chip."""

    kind: Literal["row_reduce"] = "row_reduce"
    prologue: dict[Identifier, SympyExpr] = {}
    reductions: list[Reduction] = Field(min_length=1)
    conventions: list[Convention] = Field(min_length=1)


class Layer(_Model):
    """A `kernels` layer: a stateless nn.Module whose forward replaces ``replaces``. ``bind`` maps each op argument
    to a forward argument, an attribute of the replaced module (``self.weight``) or a submodule applied to a forward
    argument (``self.gate_proj(x)``); ``returns`` is a submodule the op's output goes through (``self.down_proj``);
    ``condition`` (the replaced module -> bool) picks the instances whose forward the layer computes. A forward
    argument no op argument is bound to has a value in ``defaults`` (as the replaced forward), and the layer computes
    that value only: another raises. ``replaces`` may name a function kernels turns into a module (rotary)."""

    name: Annotated[str, Field(pattern=r"^[A-Z][A-Za-z0-9]{0,39}$")]
    replaces: list[Annotated[str, Field(pattern=DOTTED_PATH)]] = Field(min_length=1)
    forward_args: list[Identifier] = Field(min_length=1)
    bind: dict[str, Annotated[str, _check(re.compile(r"(self\.)?[a-z_][a-z0-9_]*|self\.[a-z_][a-z0-9_]*\([a-z_][a-z0-9_]*\)"
                                                     ).fullmatch, "a forward argument, 'self.<attribute>' or "
                                                                  "'self.<submodule>(<forward argument>)'")]]
    returns: Annotated[str, Field(pattern=r"^self\.[a-z_][a-z0-9_]*$")] | None = None
    condition: Callable[[Any], bool] | None = None
    defaults: dict[Identifier, StrictBool | StrictInt] = {}
    convention: Identifier


class OpSpec(_Model):
    name: Identifier
    summary: Text = Field(min_length=1)
    tensors: list[Tensor] = Field(min_length=2)
    params: list[Param] = []
    structure: RowReduce | Elementwise | Rotary = Field(discriminator="kind")
    reference: Callable[..., Any]
    layers: list[Layer] = []
    # Implementations users run today, called like the op (inputs, then params): the benchmark's
    # peers. The first is also timed under torch.compile. Names head bench's Markdown tables and plot legends.
    peers: dict[Annotated[Text, Field(pattern=r"^[^|$\[]+$")], Callable[..., Any]] = {}
    # output -> the input it overwrites in the op's in-place form `<op>_` (which returns the other
    # outputs), e.g. {"residual_out": "residual"}
    inplace: dict[Identifier, Identifier] = {}

    @model_validator(mode="after")
    def _consistent(self) -> OpSpec:
        structure = self.structure
        reductions = getattr(structure, "reductions", [])
        prologue = getattr(structure, "prologue", {})
        halves = [h for t in self.tensors if t.halves for h in t.halves]
        names = [t.name for t in self.tensors] + [p.name for p in self.params] + halves
        stats = [r.stat for r in reductions]
        outputs = {t.name for t in self.tensors if t.role == "output"}
        names += [v for v in prologue if v not in outputs]  # a prologue value may be written as an output
        dupes = {n for n in names + stats if (names + stats).count(n) > 1}
        if dupes:
            raise ValueError(f"names must be unique across tensors, halves, params and stats; repeated: {sorted(dupes)}")
        loop_k = set() if structure.kind == "rotary" else {"k"}  # row kernels' loop; rotary kernels read args.k
        clash = (set(names) | set(stats)) & (BUILTIN_SYMBOLS | {"row_sum"} | GENERATED_NAMES | loop_k)
        clash |= {n for n in names for m in names if n != m and n.startswith(m) and n.endswith(GENERATED_SUFFIXES)}
        if clash:
            raise ValueError(f"names {sorted(clash)} are reserved for kgen's own symbols (identifiers of the "
                             "generated code, or another name plus a suffix the generated code appends)")
        row_inputs = [t for t in self.tensors if t.role == "input" and t.per_row]
        if not row_inputs or row_inputs[0].name != "x" or row_inputs[0].broadcast:
            raise ValueError("an op's first '*rows ...' input must be named 'x' and not broadcast "
                             "(the tensor whose dtype, device and shape the op follows)")
        flags = [t.optional for t in self.tensors if t.role == "input"]
        if flags != sorted(flags):
            raise ValueError("optional inputs must come after every required input (Python signature order)")
        ref_params = inspect.signature(self.reference).parameters
        copied = [self.reference, *reference_helpers(self.reference)]
        foreign = set().union(*(_global_names(f.__code__) for f in copied)) - REFERENCE_GLOBALS - set(dir(builtins)) \
            - {f.__name__ for f in copied}
        if foreign:
            raise ValueError(f"reference uses {sorted(foreign)} from its module; a generated project's test "
                             f"copies the reference and the functions it calls, with {sorted(REFERENCE_GLOBALS)} "
                             "imported")
        if len(structure.conventions) > 1 and "convention" not in ref_params:
            raise ValueError("reference must take a `convention` argument (the op has several conventions)")
        if not outputs or any(not t.per_row for t in self.tensors if t.role == "output"):
            raise ValueError("an op needs '*rows hidden' outputs only, and at least one")

        params = {p.name for p in self.params}
        known = set(params) | BUILTIN_SYMBOLS
        columns = {t.name for t in self.tensors if t.role == "input" and not t.per_row and not t.coordinates}
        given = {t.name for t in self.tensors if t.coordinates}
        if given != ({structure.grid.coordinates_input} - {None} if getattr(structure, "grid", None) else set()):
            raise ValueError("a 'batch axes tokens' input is the coordinates_input of a rotary op's grid angles, "
                             "and that input needs one")
        if structure.kind == "rotary":
            inputs = self._check_rotary(columns)
        elif structure.kind == "elementwise":
            if columns or any(t.broadcast for t in self.tensors):
                raise ValueError("an elementwise op takes '*rows hidden' and '*rows 2*hidden' inputs only "
                                 "(no per-column or broadcast inputs)")
            inputs = {t.name for t in row_inputs if not t.packed} | set(halves)
        else:
            if any(t.packed for t in self.tensors):
                raise ValueError("packed '*rows 2*hidden' inputs belong to elementwise ops")
            row_names = {t.name for t in row_inputs}
            for name, expr in prologue.items():
                _check_symbols(expr, row_names | known, f"structure.prologue.{name}")
            if prologue and not set().union(*(map(str, e.free_symbols) for e in prologue.values())) & row_names:
                raise ValueError("structure.prologue: reads no '*rows ...' input (its values stand for the row's)")
            row_values = set(prologue) or row_names  # what the later passes read from the row
            for i, red in enumerate(reductions):
                _check_symbols(red.summand, row_values | known, f"structure.reductions.{i}.summand", False)
                _check_symbols(red.finalize, known | {"row_sum"}, f"structure.reductions.{i}.finalize", False)
                known.add(red.stat)
            inputs = row_values | columns | set(self.late_inputs)
        seen = set()
        for i, conv in enumerate(structure.conventions):
            if conv.name in seen:
                raise ValueError(f"structure.conventions.{i}.name: {conv.name!r} is repeated")
            seen.add(conv.name)
            if set(conv.outputs) != outputs:
                raise ValueError(f"structure.conventions.{i}.outputs: expected one expression for each of "
                                 f"{sorted(outputs)}, got {sorted(conv.outputs)}")
            for out, expr in conv.outputs.items():
                _check_symbols(expr, inputs | known, f"structure.conventions.{i}.outputs.{out}")
            if not set(conv.prologue) <= set(prologue):
                raise ValueError(f"structure.conventions.{i}.prologue: may only replace the structure's prologue "
                                 f"values {sorted(prologue)}, got {sorted(conv.prologue)}")
            for name, expr in conv.prologue.items():
                _check_symbols(expr, {t.name for t in row_inputs} | set(params) | BUILTIN_SYMBOLS,
                               f"structure.conventions.{i}.prologue.{name}")
        overwritable = {t.name for t in row_inputs if t.dtype == "io" and not (t.packed or t.broadcast or t.optional)}
        if not set(self.inplace) <= outputs or not set(self.inplace.values()) <= overwritable:
            raise ValueError(f"inplace: maps outputs {sorted(outputs)} to the inputs they overwrite, required "
                             f"'*rows hidden' inputs of the same shape {sorted(overwritable)}; got {self.inplace}")
        op_args = {t.name for t in self.tensors if t.role == "input"} | params
        for i, layer in enumerate(self.layers):
            if layer.convention not in seen:
                raise ValueError(f"layers.{i}.convention: {layer.convention!r} is not one of {sorted(seen)}")
            required = {t.name for t in self.tensors if t.role == "input"}
            if not required <= set(layer.bind) or not set(layer.bind) <= op_args:
                raise ValueError(f"layers.{i}.bind: expected keys {sorted(op_args)} (every input), "
                                 f"got {sorted(layer.bind)}")
            args = {re.sub(r"^self\.\w+\((\w+)\)$", r"\1", v) for v in layer.bind.values() if "self." not in v or "(" in v}
            if not args <= set(layer.forward_args):
                raise ValueError(f"layers.{i}.bind: {sorted(args - set(layer.forward_args))} are not forward arguments "
                                 f"{layer.forward_args}")
            tail = layer.forward_args[len(layer.forward_args) - len(layer.defaults):]
            if set(layer.forward_args) - args - set(layer.defaults) or set(layer.defaults) != set(tail):
                raise ValueError(f"layers.{i}.defaults: every forward argument no op argument is bound to needs one, "
                                 f"and they are the last arguments; got {layer.defaults} for {layer.forward_args}")
        return self

    def _check_rotary(self, columns: set[str]) -> set[str]:
        """The rotary rules; returns the symbols an output expression may use."""
        structure, rotated, tables = self.structure, self.rotated_inputs, self.tables
        if columns or any(t.packed or t.optional or t.broadcast for t in rotated):
            raise ValueError("a rotary op rotates required '*rows hidden' inputs (q, and optionally k) and may take "
                             "cos and sin tensors; nothing else")
        if len(rotated) > 2 or len(rotated) != len(self.outputs):
            raise ValueError(f"a rotary op has one output per rotated input (at most 2): inputs "
                             f"{[t.name for t in rotated]}, outputs {[t.name for t in self.outputs]}")
        if structure.grid is None and (len(tables) != 2 or any(not t.broadcast for t in tables)):
            raise ValueError("a rotary op without grid angles takes cos and sin tensors with broadcast=True")
        if any(self.inplace.get(o.name, r.name) != r.name for o, r in zip(self.outputs, rotated)):
            raise ValueError("inplace: a rotary op's output may only overwrite its own rotated input")
        names, grid = {t.name for t in rotated}, structure.grid
        if grid is not None:
            if tables or structure.pairing != "interleaved":
                raise ValueError("grid angles serve interleaved pairs, with no cos/sin tensors")
            ints = {p.name for p in self.params if p.integer}
            sizes = len(grid.axes) if grid.coordinates_input is None else 0
            if not set(grid.sizes) <= ints or not (len(grid.sizes) == sizes and len(grid.axes) == len(grid.coordinates)):
                raise ValueError(f"structure.grid: one coordinate per axis, and one size per axis (an integer param; "
                                 f"have {sorted(ints)}) unless the coordinates come from coordinates_input")
            floats = {p.name for p in self.params if not p.integer}
            for axis, expr in zip(grid.axes, grid.coordinates):
                _check_symbols(expr, {axis} | floats, f"structure.grid.coordinates.{axis}", False)
            _check_symbols(grid.frequency, {"k", "n_freq"} | floats, "structure.grid.frequency", False)
            _check_symbols(grid.angle, {"freq", "coord"} | floats, "structure.grid.angle", False)
        return names | {f"{n}_pair" for n in names} | {"cos", "sin", "sign"}

    # -- views the other rooms read ------------------------------------------------------------
    @property
    def inputs(self) -> list[Tensor]:
        return [t for t in self.tensors if t.role == "input"]

    @property
    def row_inputs(self) -> list[Tensor]:
        return [t for t in self.inputs if t.per_row]

    @property
    def column_inputs(self) -> list[Tensor]:
        return [t for t in self.inputs if not t.per_row and not t.coordinates]

    @property
    def tables(self) -> list[Tensor]:
        """rotary: the cos and sin inputs."""
        return [t for t in self.inputs if t.name in ("cos", "sin")]

    @property
    def rotated_inputs(self) -> list[Tensor]:
        """rotary: the tensors rotated into the outputs, in order (x, then k)."""
        return [t for t in self.inputs if t.dtype == "io" and t.name not in ("cos", "sin")]

    @property
    def outputs(self) -> list[Tensor]:
        return [t for t in self.tensors if t.role == "output"]

    @property
    def row_values(self) -> list[str]:
        """row_reduce: the per-element values kept on chip: the prologue's, else the row inputs
        the reductions read."""
        structure = self.structure
        if structure.kind != "row_reduce":
            return []
        if structure.prologue:
            return list(structure.prologue)
        used = {str(s) for r in structure.reductions for s in r.summand.free_symbols}
        return [t.name for t in self.row_inputs if t.name in used or t.name == "x"]

    @property
    def late_inputs(self) -> list[str]:
        """row_reduce: the row inputs only the epilogue reads (read there, never kept on chip)."""
        structure = self.structure
        if structure.kind != "row_reduce":
            return []
        prologues = [structure.prologue] + [c.prologue for c in structure.conventions]
        early = {str(s) for p in prologues for e in p.values() for s in e.free_symbols} | set(self.row_values)
        return [t.name for t in self.row_inputs if t.name not in early]

    @property
    def default_convention(self) -> str:
        return self.structure.conventions[0].name


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


def _check_symbols(expr: sp.Expr, allowed: set[str], where: str, rounds: bool = True) -> None:
    """``rounds``: to_io_dtype may appear (not in reductions and grid angles: fp32 code with no I/O dtype)."""
    unknown = sorted(str(s) for s in expr.free_symbols if str(s) not in allowed)
    if unknown:
        raise ValueError(f"{where}: unknown symbols {unknown}; allowed here: {sorted(allowed)}")
    printable = SUPPORTED_FUNCTIONS - (set() if rounds else {"to_io_dtype"})
    funcs = {type(n).__name__ for n in sp.preorder_traversal(expr) if not isinstance(n, _NODES)} - printable
    if funcs:
        raise ValueError(f"{where}: functions {sorted(funcs)} have no CUDA printing here; known: {sorted(printable)}")


REFERENCE_GLOBALS = {"torch", "F", "math"}  # torch.nn.functional as F
_NODES = (sp.Symbol, sp.Number, sp.NumberSymbol, sp.Add, sp.Mul, sp.Pow, sp.UnevaluatedExpr, sp.Rel, sp.And, sp.Or,
          sp.Not, sp.ITE, sp.logic.boolalg.BooleanAtom, sp.functions.elementary.piecewise.ExprCondPair)  # and these:
SUPPORTED_FUNCTIONS = set("to_io_dtype exp log tanh erf sqrt Abs Max Min Piecewise floor re".split())
