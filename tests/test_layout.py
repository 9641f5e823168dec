"""The rooms of kgen and their one-way arrows (spec -> family (plan, context) -> render -> project -> build ->
load), the rule that the core never asks which structure family it holds, and each module's size."""

from __future__ import annotations

import ast
import re
from pathlib import Path

KGEN = Path(__file__).resolve().parents[1] / "kgen"
TEMPLATES = Path(__file__).resolve().parents[1] / "codegen_templates"
FAMILY_NAMES = ("row_reduce", "elementwise", "rotary", "column_reduce")

# module -> the kgen modules it may import
ALLOWED = {
    "errors": set(),
    "dsl": set(),
    "profile": set(),
    "codegen": set(),
    "autodiff": {"dsl"},  # the math room: gradients of spec expressions
    "__init__": set(),
    # the structure families: each owns its DSL node, plan, render context, shapes and templates
    "families.base": {"codegen", "dsl", "profile"},
    # a row reduction derives its backward as a column reduction
    "families.row_reduce": {
        "codegen",
        "dsl",
        "errors",
        "profile",
        "families.base",
        "families.row_backward",
    },
    "families.row_backward": {"autodiff", "dsl", "families.column_reduce"},
    "families.column_reduce": {"autodiff", "codegen", "dsl", "profile", "families.base"},
    "families.elementwise": {"autodiff", "codegen", "dsl", "profile", "families.base"},
    "families.rotary": {
        "codegen",
        "dsl",
        "profile",
        "families.base",
        "families.rotary_backward",
        "families.rotary_grid",
        "families.rotary_norm",
    },
    "families.rotary_backward": {"autodiff", "dsl", "families.rotary_norm"},
    "families.rotary_grid": {"codegen", "dsl", "families.base"},
    "families.rotary_norm": {"autodiff", "codegen", "dsl"},
    "families.softmax_loss": {"autodiff", "codegen", "dsl", "profile", "families.base"},
    "families.__init__": {
        "dsl",
        "errors",
        "families.base",
        "families.row_reduce",
        "families.elementwise",
        "families.rotary",
        "families.column_reduce",
        "families.softmax_loss",
    },
    # the core asks the registry (families.__init__) for a spec's family
    "catalog": {"dsl", "errors", "families.__init__", "families.base", "profile", "spec_helpers"},
    "spec_helpers": set(),  # the helper modules beside a spec, importable while it executes
    "planner": {"dsl", "errors", "families.__init__", "families.base", "profile"},
    "project": {"catalog", "dsl", "errors", "planner", "profile"},
    "render": {
        "__init__",
        "autodiff",
        "catalog",
        "dsl",
        "errors",
        "families.__init__",
        "families.base",
        "profile",
        "project",
    },
    "builder": {"catalog", "errors", "families.__init__", "planner", "profile", "project", "render"},
    "check": {"catalog", "errors", "families.__init__"},
    "bench": {
        "autodiff",
        "bench_report",
        "builder",
        "catalog",
        "dsl",
        "errors",
        "families.__init__",
        "families.base",
    },
    "bench_report": set(),
    "sweep": {"bench", "bench_report", "catalog", "errors", "families.base"},
    "tune": {
        "bench",
        "builder",
        "catalog",
        "errors",
        "families.__init__",
        "families.base",
        "planner",
        "profile",
        "project",
        "render",
        "sweep",  # the held-out shapes: random (rows, hidden) pairs, as the sweep draws them
    },
    "cli": {
        "bench",
        "bench_report",
        "check",
        "builder",
        "catalog",
        "errors",
        "families.base",
        "integrations.e2e",
        "planner",
        "project",
        "sweep",
        "tune",
    },
    "__main__": {"cli"},
    # the models' side: they build and load projects, nothing in kgen imports them but the CLI's --e2e
    "integrations.__init__": set(),
    "integrations.transformers": {
        "builder",
        "catalog",
        "errors",
        "integrations.attention",
        "integrations.causal_mask",
        "integrations.decoder",
        "integrations.grouped_decode",
    },
    "integrations.causal_mask": {"integrations.decoder"},
    "integrations.grouped_decode": {"integrations.decoder"},
    "integrations.decoder": set(),
    "integrations.attention": {"integrations._rotary_fit", "integrations.decoder"},
    "integrations._rotary_fit": {"families.rotary"},
    "integrations.diffusers": {
        "builder",
        "errors",
        "integrations._diffusers_common",
        "integrations.flux",
        "integrations.wan",
    },
    "integrations._diffusers_common": {"errors", "integrations._rotary_fit"},
    "integrations.flux": {"errors", "integrations._diffusers_common", "integrations._flux_attention"},
    "integrations._flux_attention": {"integrations._diffusers_common"},
    "integrations.wan": {"errors", "integrations._diffusers_common"},
    "integrations.workloads": {"errors", "integrations.diffusion", "integrations.transformers"},
    "integrations.diffusion": {"integrations.diffusers", "integrations.wan"},
    "integrations.e2e": {"errors", "integrations.gpu_clock", "integrations.workloads"},
    "integrations.gpu_clock": set(),
}

# Lines per module, with room to grow: a module that outgrows its size should be split, not packed denser.
SIZES = {
    "families/row_reduce.py": 725,  # the one-reduction steps of the ladder (a profile fact, validated)
    # example_input(s): the inputs a family draws (labels, a saved loss, probes); refuses: a binding's shapes
    "families/base.py": 433,
    # rotary: refuses, the binding's shape checks; a stale tuning entry named; the example heads a norm
    # serves; the grid angles a batch shares
    "families/rotary.py": 580,
    "families/rotary_backward.py": 140,
    "families/rotary_grid.py": 200,
    "families/rotary_norm.py": 240,  # refuses: the head sizes the binding serves, a head across warps too
    "families/column_reduce.py": 668,  # two schedules (rows held on chip, split rows); passed-on gradients
    "families/row_backward.py": 256,  # split and zero-sum parts, passed-on gradients, saved sums
    "families/elementwise.py": 262,
    "families/softmax_loss.py": 410,  # the loss, its gradient (lse from the saved loss), labels, evaluation
    "families/__init__.py": 80,
    "dsl.py": 650,  # functions checked by class (an undefined sigmoid is none), the params the math reads
    "bench.py": 420,
    "bench_report.py": 210,  # the tables, the plot, the summary, one run's report
    "sweep.py": 200,
    "cli.py": 560,  # explain: the op's first shape, an arch without the dtype left out of --arch all, --param
    "render.py": 445,
    "builder.py": 360,
    # specs, families, profiles, tuning tables (a user's beside the spec), shapes schema (params the spec's)
    "catalog.py": 400,  # check_params: shapes.toml's and explain --param's
    "spec_helpers.py": 50,
    "tune.py": 250,  # candidates, the measured and held-out shapes, the table
    "project.py": 220,
    "profile.py": 145,  # a tuning entry measured against another rule: stale, named
    "codegen.py": 170,
    "planner.py": 60,
    # other param values, a broken reference as one line, the probes-only hint, NaN and ±inf, a backward
    # against two references (at float64 leaves and at leaves in the dtype)
    "check.py": 240,
    "autodiff.py": 130,  # the backward reference at leaves in the dtype too
    "errors.py": 40,
    "integrations/diffusers.py": 340,
    "integrations/flux.py": 370,  # both block kinds, the model forward (the attention: _flux_attention.py)
    "integrations/_flux_attention.py": 100,  # the attention processor, what pos_embed hands it
    "integrations/wan.py": 340,
    "integrations/_diffusers_common.py": 80,
    "integrations/e2e.py": 300,  # the timing harness and its report, with the --profile kernel tables, clocks
    "integrations/gpu_clock.py": 90,  # the SM clock and power while each variant is timed
    "integrations/workloads.py": 180,
    "integrations/diffusion.py": 200,  # ltx, flux, wan and the training steps of ltx and wan
    "integrations/transformers.py": 180,  # the layers, and the causal-LM loss (causal_lm_loss)
    "integrations/causal_mask.py": 95,  # the causal mask left to SDPA's is_causal under torch.compile
    "integrations/decoder.py": 110,  # the decoder layers' residual adds fused with their norms
    "integrations/attention.py": 125,  # Qwen3's q/k norms fused with the rotary embedding
    "integrations/grouped_decode.py": 110,  # a decode step's attention on the grouped k/v heads
    "integrations/_rotary_fit.py": 20,  # the head sizes the fused q/k norm kernels serve
}


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(KGEN).with_suffix("").parts)


def kgen_imports(path: Path) -> set[str]:
    """The kgen modules a file imports, as ALLOWED names them (a package's own __init__ included)."""
    found, package = set(), path.relative_to(KGEN).parent.parts
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level >= 1:
            base = package[: len(package) - (node.level - 1)]
            if node.module:
                found.add(".".join((*base, node.module)))
            else:  # from . import a, b: modules of the package, or names of its __init__
                for alias in node.names:
                    module = ".".join((*base, alias.name))
                    found.add(
                        module
                        if (KGEN.joinpath(*base, f"{alias.name}.py")).is_file()
                        else ".".join((*base, "__init__"))
                    )
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("kgen"):
            found.add(node.module.split(".", 1)[1] if "." in node.module else "__init__")
    return {f"{m}.__init__" if (KGEN / m.replace(".", "/")).is_dir() else m for m in found}


def core_modules() -> list[Path]:
    return [p for p in KGEN.rglob("*.py") if "families" not in p.relative_to(KGEN).parts]


def test_arrows_point_one_way():
    modules = {module_name(p): p for p in KGEN.rglob("*.py")}
    assert set(modules) == set(ALLOWED), "a new module needs its place in ALLOWED"
    for name, path in modules.items():
        extra = kgen_imports(path) - ALLOWED[name]
        assert not extra, f"kgen/{name}.py imports {sorted(extra)}: that arrow points the wrong way"


def test_module_sizes():
    for rel, size in SIZES.items():
        lines = len((KGEN / rel).read_text().splitlines())
        assert lines <= size, f"kgen/{rel} has {lines} lines, over its size of {size}: split it"
    assert {
        str(p.relative_to(KGEN)) for p in KGEN.rglob("*.py") if len(p.read_text().splitlines()) > 20
    } <= set(SIZES)


def family_branches(tree: ast.AST) -> list[str]:
    """Places where code asks which structure kind it holds: a comparison with `.kind` or a family's name,
    or an isinstance / issubclass against a family's DSL node."""
    found = []
    nodes = {"RowReduce", "Elementwise", "Rotary", "GridAngles", "Reduction"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            parts = [node.left, *node.comparators]
            if any(isinstance(p, ast.Attribute) and p.attr in ("kind", "family") for p in parts) or any(
                isinstance(p, ast.Constant) and p.value in FAMILY_NAMES for p in parts
            ):
                found.append(ast.unparse(node))
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("isinstance", "issubclass"):
            if (
                nodes & {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
                if len(node.args) > 1
                else ()
            ):
                found.append(ast.unparse(node))
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.slice, ast.Constant)
            and node.slice.value in FAMILY_NAMES
        ):
            found.append(ast.unparse(node))  # a table keyed by family
    return found


def test_the_core_never_asks_which_family():
    """No `kind ==` or isinstance-on-structure branch outside kgen/families/ (the registry answers once),
    and no core template asks either: a new structure kind is a new family module and its templates."""
    for path in core_modules():
        found = family_branches(ast.parse(path.read_text()))
        assert not found, f"kgen/{path.relative_to(KGEN)} branches on the structure family: {found}"
    core_templates = [p for p in TEMPLATES.rglob("*.j2") if p.parent.name not in (*FAMILY_NAMES, "rows")]
    for path in core_templates:
        text = path.read_text()
        assert not re.search(r"\bkind\b|\bpairing\b|\bgrid\b|" + "|".join(FAMILY_NAMES), text), path


def test_the_branch_finder_finds_branches():
    for code in (
        'if spec.structure.kind == "rotary": pass',
        "x = isinstance(s, RowReduce)",
        'y = {"rotary": 1}["rotary"]',
        'z = plan.family != "elementwise"',
    ):
        assert family_branches(ast.parse(code)), code
    assert not family_branches(ast.parse('if spec.name == "rmsnorm": pass'))
