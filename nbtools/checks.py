"""Check ids, the tag scheme, the verdicts (``Status``), and the verdict lines assertion cells print.

Tag scheme (documented in README): an assertion cell carries the cell tag
``check:<id>`` (e.g. ``check:acc-launch``). It runs plain ``assert`` statements and
ends with ``passed("<id>")``; a check that cannot run here calls
``skipped("<id>", "<reason>")`` instead. The runner reads the executed notebook:
an error in the cell -> failed; a verdict line -> passed / skipped; no verdict, or the
cell never ran -> failed. The exceptions are in errors.py, the expected-block rules in expected.py.
"""

from __future__ import annotations

import re
from enum import Enum

from .errors import ParameterError


class Status(str, Enum):
    """The one set of verdicts, for checks (passed, failed, skipped, missing) and notebooks (passed, failed,
    not-run), as report.json, junit.xml, report.md and index.html write them."""

    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"
    MISSING = "missing"
    NOT_RUN = "not-run"
    __str__ = str.__str__  # "passed" in f-strings, format() and templates, on every Python (3.10 to 3.12 checked)

    @property
    def ok(self) -> bool:
        """A run passes when every verdict is ok: passed, or skipped with its reason."""
        return self in (Status.PASSED, Status.SKIPPED)

    @property
    def colours(self) -> tuple[str, str]:
        """index.html's badge: background and text colour."""
        green, yellow, red = ("#dafbe1", "#116329"), ("#fff8c5", "#7d4e00"), ("#ffebe9", "#a40e26")
        return green if self is Status.PASSED else yellow if self is Status.SKIPPED else red


SEED_CHECKS = (
    "check-py",
    "check-torch",
    "acc-install-binary",
    "acc-install-source",
    "acc-env",
    "acc-launch",
    "acc-train-single",
    "acc-prepare",
    "acc-launch-bf16",
    "acc-gather-multi",
    "acc-empty-weights",
    "acc-dispatch",
)
TAG_PREFIX = "check:"
VERDICT = re.compile(r"^\[check\] (PASSED|SKIPPED) (\S+)(?: -- (.*))?$", re.MULTILINE)


def check_ids(tags) -> list[str]:
    """The check ids named by a cell's tags."""
    return [t[len(TAG_PREFIX):] for t in tags or () if isinstance(t, str) and t.startswith(TAG_PREFIX)]


def passed(check_id: str, detail: str = "") -> None:
    """Print the verdict line of a check whose assertions all held (call it last in the cell)."""
    print(f"[check] PASSED {check_id}" + (f" -- {detail}" if detail else ""))


def skipped(check_id: str, reason: str) -> None:
    """Print the verdict line of a check that cannot run here, with the reason recorded in the report."""
    if not reason or not reason.strip():
        raise ParameterError(f"skipped({check_id!r}, ...): a skip needs its reason, recorded in the report")
    print(f"[check] SKIPPED {check_id} -- {reason}")
