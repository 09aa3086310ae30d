"""Shared fixtures: a scratch dir per test, a helper that lists surviving processes, and the lock that lets
two pytest-xdist workers share this machine."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = os.path.join(ROOT, "notebooks")

# Keep the tests themselves offline, like the notebooks. A test that proves the notebooks or the
# launcher go offline by themselves runs them with ``without_offline_env()`` instead.
# Ascend's examples-guard result.json (Ascend/docs, .github/workflows/schemas/result.schema.json, draft-07), as read
# on 2026-12-04: the six required fields, target_repo as owner/name, the two enums.
RESULT_SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "required": ["trigger", "target_repo", "target_ref", "path", "image", "job_status"],
    "properties": {
        **{k: {"type": "string", "minLength": 1} for k in ("trigger", "target_ref", "path", "image")},
        "target_repo": {"type": "string", "pattern": "^[^/]+/[^/]+$"},
        "job_status": {"enum": ["success", "failure", "cancelled"]},
        "source": {"enum": ["upstream", "project"]},
    },
}
OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def terminal_signals() -> list[str]:
    """Give this process (and so every process a test starts) the signal dispositions of a terminal.

    A shell starts a background job (`cmd &`) with SIGINT and SIGQUIT ignored, and `nohup` ignores
    SIGHUP; an ignored signal stays ignored in every child, and a non-interactive bash cannot reset
    it (`trap`). CI runs this suite that way: a test's Ctrl-C or hangup then reached a process that
    ignored it, and four lifecycle tests waited out their bounds (reproduced with
    `trap '' INT HUP; pytest ...`). The tests play a learner at a terminal, where both are default.
    Returns the names it had to reset (the report header says so)."""
    import signal

    reset = []
    for sig, default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGHUP, signal.SIG_DFL)):
        if signal.getsignal(sig) == signal.SIG_IGN:
            signal.signal(sig, default)
            reset.append(sig.name)
    return reset


SIGNALS_RESET = terminal_signals()


def without_offline_env() -> dict[str, str]:
    """This environment minus every Hugging Face offline switch (ours above, or the user's)."""
    return {k: v for k, v in os.environ.items() if k not in OFFLINE_VARS}


def processes_mentioning(text: str) -> list[psutil.Process]:
    """Live processes whose command line mentions ``text`` (a unique script path)."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if any(text in part for part in (p.info["cmdline"] or [])):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


def wait_gone(text: str, timeout: float = 10.0) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = processes_mentioning(text)
        if not left:
            return []
        time.sleep(0.2)
    return processes_mentioning(text)


# The one definition of "in CI" for the tests: CI=true (or any value but empty/0/false/no), as .ci/run sets it.
IN_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def ci_output(name: str) -> Path | None:
    """The output folder of the README command that wrote ``nbtools-output/<name>`` before the tests in CI (.ci/run's
    order: series, series-simulated-npu, simulated-310p, answers, ...), if its report is newer than everything it ran
    (notebooks, nbtools, simnpu): the one freshness rule; else None, and the test makes a run of its own that proves
    the same (or, with ``required_ci_output``, skips outside CI)."""
    folder = Path(ROOT, "nbtools-output", name)
    report = folder / "report.json"
    sources = [*Path(NOTEBOOKS).rglob("*.ipynb"), *Path(ROOT, "nbtools").glob("*.py"), *Path(ROOT, "simnpu", "site").rglob("*.py")]
    if not report.is_file() or report.stat().st_mtime < max(f.stat().st_mtime for f in sources):
        return None
    return folder


def required_ci_output(name: str, command: str) -> Path:
    """``ci_output(name)``, which a test cannot do without: outside CI it skips (saying which README command makes
    it), in CI it fails."""
    folder = ci_output(name)
    if folder is None:
        skip_outside_ci(f"no fresh report in nbtools-output/{name} (missing, or older than the notebooks, nbtools or "
                        f"simnpu): run the README's ci:{command} command first")
    return folder


def skip_outside_ci(why: str) -> None:
    """Skip on a developer's machine; fail under CI, which has what the test needs (the package index, localedef,
    ruff, Chromium, `unshare -n`)."""
    if IN_CI:
        pytest.fail(f"{why} (CI=true: .ci/run must provide it)", pytrace=False)
    pytest.skip(why)


@pytest.fixture
def python() -> str:
    return sys.executable


# The suite runs in two processes (pytest-xdist, `-n auto` in pyproject.toml): most tests wait on real
# processes (ranks, kernels, grace periods) far more than they compute. A test that stops every nbtools
# launch on the machine (`nbtools reset`) is marked `alone` and holds this lock exclusively; every other
# test holds it shared (a run of the whole series too, unless it cannot have namespaces of its own: see
# `on_its_own`).
MACHINE_LOCK = os.path.join(tempfile.gettempdir(), f"nbtools-tests-{os.getuid()}.lock")
_held: list = []  # (open lock file, exclusive?) while this process holds the lock


@contextlib.contextmanager
def machine(exclusive: bool = False):
    """Hold the machine lock; inside a hold of this process (a test's own), make that hold exclusive meanwhile."""
    if _held:
        lock, was = _held[-1]
        if exclusive and not was:
            fcntl.flock(lock, fcntl.LOCK_EX)  # flock converts the held lock (releasing it first: no deadlock)
        try:
            yield
        finally:
            if exclusive and not was:
                fcntl.flock(lock, fcntl.LOCK_SH)
        return
    with open(MACHINE_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        _held.append((lock, exclusive))
        try:
            yield
        finally:
            _held.pop()
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(autouse=True)
def _share_the_machine(request):
    with machine(exclusive=request.node.get_closest_marker("alone") is not None):
        yield


def isolated_prefix() -> list[str]:
    """A command prefix that runs its command with no network but loopback (a new network namespace)
    and seeing only its own processes (a new pid namespace), or [] where this machine does not allow
    it (not root, no unshare). The shell stays as the namespace's first process, reaping orphans."""
    isolate = ["unshare", "-n", "-p", "-f", "--mount-proc"]
    if not (shutil.which("unshare") and shutil.which("ip")):
        return []
    if subprocess.run([*isolate, "true"], capture_output=True).returncode != 0:
        return []
    return [*isolate, "sh", "-c", 'ip link set lo up && "$@"', "sh"]


@contextlib.contextmanager
def on_its_own():
    """``isolated_prefix()`` for a run of 00_ascend_jupyterlab, which lists every launch left on the machine (a
    lifecycle test's launch may be ending meanwhile); where there is none, the run holds the machine alone."""
    prefix = isolated_prefix()
    with machine(exclusive=not prefix):
        yield prefix


def pytest_report_header(config) -> str | None:
    if SIGNALS_RESET:
        return f"signals: {', '.join(SIGNALS_RESET)} ignored on entry (a background job?); reset to a terminal's defaults"
    return None


def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto`: two workers at most; every test starts real processes, and more would only queue for the CPU."""
    return max(1, min(2, os.cpu_count() or 1))


# The suite's longest files, longest first, as measured in CI (`--durations`): with `--dist loadfile
# --no-loadscope-reorder` (pyproject.toml) xdist hands the files out in this order, two per worker, then the rest
# as the workers free up, so that the workers end together and no long file starts last. xdist's own order (most
# tests first) started the long files of few tests last. (`--dist loadgroup` would split a file, but with pytest 9.2
# it groups nothing: pytest-xdist issue 1386.)
LONGEST_FIRST = ("test_browser.py", "test_own_job.py", "test_install.py", "test_simnpu.py", "test_notebooks.py",
                 "test_accelerate_suite.py", "test_route_proof.py", "test_launcher.py", "test_reliability.py",
                 "test_guard.py", "test_lifecycle.py")


def pytest_collection_modifyitems(items) -> None:
    """The longest files first (LONGEST_FIRST, then the rest as collected), the `alone` tests' files last (they wait
    for every running test, a series run included)."""
    alone = {item.path for item in items if item.get_closest_marker("alone")}
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: (item.path in alone, rank.get(item.path.name, len(rank))))
