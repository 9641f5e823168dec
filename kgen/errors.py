"""The errors kgen reports to its user: the CLI prints their message without a traceback and exits 2.
Each kind names the room that raised it."""

from __future__ import annotations


class KgenError(Exception):
    """A user-facing error."""


class SpecError(KgenError):
    """An op spec (ops/, $KGEN_OPS_PATH) or a structure family ($KGEN_FAMILIES_PATH) failed to load."""


class ProfileError(KgenError):
    """An arch profile (arch/) or its tuning table (arch/tuning/) failed to load."""


class PlanError(KgenError):
    """No plan for the request: a dtype the arch cannot run, a shape out of range, a stale tuning table."""


class BuildError(KgenError):
    """Rendering, compiling, linking or loading a project failed, or the toolchain is missing."""


class UsageError(KgenError):
    """The command line asked for something that does not exist or cannot run here."""
