"""The data model of a run: what `python -m nbtools run` found (RunReport, each notebook's NotebookResult with its
Failure, each check's CheckResult, which checks.py judges), what fails a run (``failures``) and the one count of their
statuses. runner.py fills it, report.py writes it out; keeping it apart keeps the house acyclic: the reports never
import the runner.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from .checks import CheckResult, Status, strip_ansi

DEFAULT_KERNEL = "python3"
CELL_TIMEOUT_S = 1800  # how long one cell may run, unless `run --timeout` says otherwise


@dataclass
class Failure:
    """Why a notebook stopped, kept as data from the kernel to report.json: PapermillExecutionError's fields, the
    check the failing cell judges, or the exception of a run that broke off (a timeout, a dead kernel, a signal)."""

    ename: str
    evalue: str = ""
    cell_index: int | None = None  # the failing cell's index in the notebook papermill ran (0-based; its error
    # markers, papermill-error-cell-tag, come into the saved copy afterwards)
    exec_count: int | None = None  # its In[n]
    check_id: str = ""  # the check that cell judges ("" when it is no check cell)
    traceback: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, exc: BaseException) -> Failure:
        if ename := getattr(exc, "ename", None):
            return cls(ename, strip_ansi(str(getattr(exc, "evalue", ""))).strip(), getattr(exc, "cell_index", None),
                       getattr(exc, "exec_count", None),
                       traceback=[strip_ansi(t) for t in getattr(exc, "traceback", [])])
        lines = strip_ansi(str(exc)).strip().splitlines()
        return cls(type(exc).__name__, lines[-1] if lines else "")

    def summary(self, name: bool = True) -> str:
        """One line: the exception's first line, the fix it names, and the cell (In[n])."""
        lines = [ln.strip() for ln in self.evalue.splitlines()]
        fixes = [ln for ln in lines[1:] if ln.lower().startswith("fix:")]  # keep what to do
        cell = [f"(cell In[{self.exec_count}])"] if self.exec_count is not None else []
        return " ".join([f"{self.ename}: " * name + (lines[0] if lines else ""), *fixes, *cell]).strip()


@dataclass
class NotebookResult:
    path: str
    status: Status  # passed / failed / not-run
    duration_s: float = 0.0
    error: str = ""  # the failure in one line, as the CLI, report.md and index.html say it
    output: str = ""  # executed notebook, relative to the output dir
    kernel_log: str = ""  # the kernel process' own output, relative to the output dir
    parameters: dict = field(default_factory=dict)  # what was injected, converted for this notebook
    failure: Failure | None = None


@dataclass
class RunReport:
    device: dict
    notebooks: list[NotebookResult] = field(default_factory=list)
    checks: list[CheckResult] = field(default_factory=list)
    parameters: dict = field(default_factory=dict)
    started: str = ""
    duration_s: float = 0.0
    kernel: str = DEFAULT_KERNEL
    stopped_by: str = ""  # "SIGINT" / "SIGTERM" / "SIGHUP" when a signal stopped the run

    @property
    def verdict(self) -> str:
        """PASSED / FAILED / STOPPED by SIGxxx: the word the CLI, report.md and index.html lead with."""
        return f"STOPPED by {self.stopped_by}" if self.stopped_by else ("PASSED" if self.ok else "FAILED")

    @property
    def ok(self) -> bool:
        return not self.stopped_by and not failures(self)


def status_counts(report: RunReport) -> dict:
    """{"checks": {status: n}, "notebooks": {status: n}, "junit": {tests, failures, skipped}}: the one count."""
    checks, notebooks = Counter(c.status for c in report.checks), Counter(n.status for n in report.notebooks)
    return {
        "checks": dict(sorted(checks.items())),
        "notebooks": dict(sorted(notebooks.items())),
        "junit": {
            "tests": len(report.notebooks) + len(report.checks),
            "failures": len(failures(report)),
            Status.SKIPPED: checks.get(Status.SKIPPED, 0),
        },
    }


def failures(report: RunReport) -> list:
    """The notebooks and checks that fail the run: every one whose status is not ok (``Status.ok``; a notebook is
    never skipped, so it fails unless it passed)."""
    return [r for r in [*report.notebooks, *report.checks] if not Status(r.status).ok]
