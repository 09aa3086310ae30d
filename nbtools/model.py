"""The data model of a run: what `python -m nbtools run` found, read by the reports.

runner.py fills a RunReport; report.py and html_report.py write it out. Keeping the model
here keeps the house acyclic: the reports never import the runner.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

DEFAULT_KERNEL = "python3"


@dataclass
class NotebookResult:
    path: str
    status: str  # passed / failed / not-run
    duration_s: float = 0.0
    error: str = ""
    output: str = ""  # executed notebook, relative to the output dir
    kernel_log: str = ""  # the kernel process' own output, relative to the output dir
    parameters: dict = field(default_factory=dict)  # what was injected, converted for this notebook


@dataclass
class CheckResult:
    id: str
    status: str  # passed / failed / skipped / missing
    notebook: str = ""
    reason: str = ""
    seed: bool = False


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
        return (
            not self.stopped_by
            and all(n.status == "passed" for n in self.notebooks)
            and all(c.status in ("passed", "skipped") for c in self.checks)
        )


_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def strip_ansi(text: str) -> str:
    """``text`` without terminal escape sequences (colours, cursor moves, OSC titles)."""
    return _ANSI.sub("", text)




def status_counts(report: RunReport) -> dict:
    """{"checks": {status: n}, "notebooks": {status: n}, "junit": {tests, failures, skipped}}: the one count."""
    checks: dict[str, int] = {}
    for c in report.checks:
        checks[c.status] = checks.get(c.status, 0) + 1
    notebooks: dict[str, int] = {}
    for n in report.notebooks:
        notebooks[n.status] = notebooks.get(n.status, 0) + 1
    failures = sum(v for k, v in notebooks.items() if k != "passed") + checks.get("failed", 0) + checks.get("missing", 0)
    return {
        "checks": dict(sorted(checks.items())),
        "notebooks": dict(sorted(notebooks.items())),
        "junit": {
            "tests": len(report.notebooks) + len(report.checks),
            "failures": failures,
            "skipped": checks.get("skipped", 0),
        },
    }
