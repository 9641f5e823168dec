"""A spec folder's helper modules: its _*.py files, which kgen loads as no spec. While one of the folder's
specs executes they import by their plain name (`from _common import eps_default`); none stays importable
after, and two folders' helpers of one name never meet."""

from __future__ import annotations

import importlib.util
import sys
from contextlib import contextmanager
from pathlib import Path

_executing: list = []  # the finders of the specs executing, the innermost last


@contextmanager
def helper_imports(folder: Path, folders: list[Path]):
    """While a spec of ``folder`` executes: the folder's helpers import by their plain name (for the
    innermost spec, where one loads another), each recorded in the list yielded (the spec's hash reads
    them); a module of any of ``folders``' helper names (another folder's) is hidden meanwhile."""
    names = {p.stem for d in folders for p in d.glob("_*.py")} - set(sys.stdlib_module_names)
    used: list[Path] = []

    class Finder:
        @staticmethod
        def find_spec(name, path=None, target=None):
            file = folder / f"{name}.py"
            if _executing[-1] is Finder and path is None and name in names and file.is_file():
                used.append(file)
                return importlib.util.spec_from_file_location(name, file)
            return None

    hidden = {n: sys.modules.pop(n) for n in names if n in sys.modules}
    sys.meta_path.insert(0, Finder)
    _executing.append(Finder)
    try:
        yield used
    finally:
        _executing.pop()
        sys.meta_path.remove(Finder)
        for name in names:
            sys.modules.pop(name, None)
        sys.modules.update(hidden)
