"""Check ids, the tag scheme, the verdicts (``Status``), and the verdict lines assertion cells print.

Tag scheme (documented in README): an assertion cell carries the cell tag
``check:<id>`` (e.g. ``check:acc-launch``). It runs plain ``assert`` statements and
ends with ``passed("<id>")``; a check that cannot run here calls
``skipped("<id>", "<reason>")`` instead. In a kernel, each displays its verdict as data (``VERDICT_MIME``:
``{"check", "status", "reason"}``) with the line a reader sees beside it (``text/plain``: ``[check] PASSED <id> --
<detail>``); elsewhere (a script, a test) it prints that line. ``verdict`` is the one judge of a check, in the
executed notebook the runner reads: an error in the cell -> failed; the cell's verdict for its id -> passed / skipped;
no verdict (a printed line is none), or the cell never ran -> failed; its notebook not run -> failed; no notebook of
the run carries it -> skipped where another notebook of the series does, else missing. The exceptions are in
errors.py, the expected-block rules in expected.py.

Each check cell also carries one ``needs:<need>`` tag per condition under which it can run (none: it passes
everywhere). ``Here`` weighs them against the run's probe and parameters; the runner expects ``passed`` where
every need is met, else ``skipped``, and fails a check whose verdict differs (``pinned``).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from enum import Enum

from .decide import cpu_stands_in, precisions_on
from .errors import ParameterError
from .lang import msg, of_metadata


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


SEED_CHECKS = ("check-py", "check-torch", "acc-install-binary", "acc-install-source", "acc-env", "acc-launch",
               "acc-train-single", "acc-prepare", "acc-launch-bf16", "acc-gather-multi", "acc-empty-weights", "acc-dispatch")
TAG_PREFIX = "check:"
VERDICT_MIME = "application/vnd.nbtools.verdict+json"  # a check cell's verdict, as the runner reads it


def check_ids(tags, prefix: str = TAG_PREFIX) -> list[str]:
    """The check ids named by a cell's tags (``prefix="needs:"``: its needs, ``needs:cards=2`` -> ``cards=2``)."""
    return [t[len(prefix):] for t in tags or () if isinstance(t, str) and t.startswith(prefix)]


def _verdict(check_id: str, status: Status, reason: str) -> None:
    """Display the verdict as data with its line beside it in a kernel (IPython 8 and 9: ``raw=True``), else print
    the line."""
    line = f"[check] {status.name} {check_id}" + (f" -- {reason}" if reason else "")
    shell = sys.modules["IPython"].get_ipython() if "IPython" in sys.modules else None
    if shell is None:
        print(line)
        return
    from IPython.display import display

    display({VERDICT_MIME: {"check": check_id, "status": status.value, "reason": reason}, "text/plain": line}, raw=True)


def passed(check_id: str, detail: str = "") -> None:
    """Give the verdict of a check whose assertions all held (call it last in the cell)."""
    _verdict(check_id, Status.PASSED, detail)


def skipped(check_id: str, reason: str) -> None:
    """Give the verdict of a check that cannot run here, with the reason recorded in the report."""
    if not reason or not reason.strip():
        raise ParameterError(f"skipped({check_id!r}, ...): a skip needs its reason, recorded in the report")
    _verdict(check_id, Status.SKIPPED, reason)


def verdict_in(outputs, check_id: str) -> tuple[Status, str] | None:
    """(status, reason) of the first verdict for ``check_id`` a cell displayed (``VERDICT_MIME``), None if none."""
    for v in (o["data"][VERDICT_MIME] for o in outputs or () if VERDICT_MIME in o.get("data", {})):
        if isinstance(v, dict) and v.get("check") == check_id and v.get("status") in (Status.PASSED, Status.SKIPPED):
            return Status(v["status"]), str(v.get("reason") or "")
    return None


NEEDS_PREFIX = "needs:"
NEEDS = ("npu", "real-npu", "accelerator", "cpu", "cards=N", "processes=N", "network", "deepspeed", "bf16",
         "param=NAME")


@dataclass(frozen=True)
class Here:
    """What a check's needs are weighed against: the probe of the run's environment and the notebook's parameters."""

    kind: str  # npu / cuda / cpu: the probe's kind, or cpu where the notebook's device parameter asks for it
    count: int = 0  # visible cards of that kind
    simulated: bool = False
    bf16: bool = True
    deepspeed: bool = False  # the kernel's interpreter finds deepspeed
    network: bool = False  # beyond the package registries (GitHub, the Hub): NBTOOLS_NETWORK=1 says so
    params_set: frozenset = frozenset()  # parameters given a value other than the notebook's default
    processes: int = 2  # the notebook's num_processes

    def meets(self, need: str) -> bool:
        name, _, arg = need.partition("=")
        if name == "cards" and arg.isdigit():
            return not cpu_stands_in(self.kind, self.count, int(arg))  # a plain CPU host: the CPU route is the honest one
        if name == "param" and arg:
            return arg in self.params_set
        if name == "processes" and arg.isdigit():
            return self.processes >= int(arg)
        rules = {"npu": self.kind == "npu", "real-npu": self.kind == "npu" and not self.simulated,
                 "accelerator": self.kind != "cpu", "network": self.network, "deepspeed": self.deepspeed,
                 "cpu": self.kind == "cpu" or cpu_stands_in(self.kind, self.count, self.processes),  # the CPU route here
                 "bf16": "bf16" in precisions_on(self.kind, self.bf16)}
        if need not in rules:
            raise ParameterError(f"unknown tag needs:{need}; known: {', '.join(NEEDS)}")
        return rules[need]

    def pinned(self, tags, status: Status, reason: str, lang: str | None = None) -> tuple[Status, str]:
        """(status, reason) of a verdict held to what the cell's needs expect here: a pass or a skip that
        differs from it fails, saying why (in ``lang``, the notebook's)."""
        if status not in (Status.PASSED, Status.SKIPPED):
            return status, reason
        needs = check_ids(tags, NEEDS_PREFIX)
        try:
            unmet = [n for n in needs if not self.meets(n)]
        except ParameterError as exc:
            return Status.FAILED, msg("checks.bad_needs", lang, error=exc)
        if status is Status.SKIPPED and not unmet:
            met = msg("list_sep", lang).join(needs) or msg("checks.no_needs", lang)
            return Status.FAILED, msg("checks.skipped_but_met", lang, met=met, reason=reason)
        if status is Status.PASSED and unmet:
            return Status.FAILED, msg("checks.passed_but_unmet", lang, unmet=msg("list_sep", lang).join(unmet))
        return status, reason


@dataclass
class CheckResult:
    id: str
    status: Status  # passed / failed / skipped / missing
    notebook: str = ""
    reason: str = ""
    seed: bool = False


def verdict(cell, check_id: str, lang: str | None = None, *, here: Here | None = None, full: bool = False,
            not_run: str | None = None, elsewhere: str = "") -> tuple[Status, str]:
    """The one judge of a check: its (status, reason), said in ``lang`` (the notebook's).

    ``cell`` None: no notebook of the run carries the check: skipped (not selected) where the series notebook
    ``elsewhere`` does, else missing. ``not_run``: the cell's notebook did not run, for that reason: failed. An error in
    the cell fails it (its first line, or all of it with ``full``), and so does a cell never reached or one that gave no
    verdict for ``check_id`` (a printed line is none); a pass or a skip is held to what the cell's needs expect
    ``here``, when given (``Here.pinned``).
    """
    if cell is None:
        if elsewhere:
            return Status.SKIPPED, msg("checks.not_selected", lang, notebook=elsewhere)
        return Status.MISSING, msg("checks.untagged", lang, check_id=check_id)
    if not_run is not None:
        return Status.FAILED, not_run
    outputs = cell.get("outputs", [])
    if (e := next((o for o in outputs if o.get("output_type") == "error"), None)) is not None:
        value = strip_ansi(str(e.get("evalue", ""))).strip()
        value = value if full else (value.splitlines() or [""])[0]
        return Status.FAILED, f"{e.get('ename', 'Error')}: {value}".strip()
    if cell.get("execution_count") is None and not outputs:
        return Status.FAILED, msg("checks.not_reached", lang)
    if (given := verdict_in(outputs, check_id)) is None:
        return Status.FAILED, msg("checks.no_verdict", lang, check_id=check_id)
    return here.pinned(cell.get("metadata", {}).get("tags"), *given, lang) if here else given


def judge_checks(nb, notebook: str, full: bool = False, here: Here | None = None,
                 not_run: str | None = None) -> list[CheckResult]:
    """Every check cell's verdict (``verdict``), its reasons in the notebook's language."""
    out, lang = [], of_metadata(nb.metadata)
    for cell in nb.cells:
        for cid in check_ids(cell.get("metadata", {}).get("tags")):
            status, reason = verdict(cell, cid, lang, here=here, full=full, not_run=not_run)
            out.append(CheckResult(cid, status, notebook, reason, cid in SEED_CHECKS))
    return out


def unexecuted_cells(nb) -> list[int]:
    """The code cells that never ran: a notebook that finished with any of them (``sys.exit``) failed."""
    return [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.strip() and c.get("execution_count") is None]


_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def strip_ansi(text: str) -> str:
    """``text`` without terminal escape sequences (colours, cursor moves, OSC titles)."""
    return _ANSI.sub("", text)
