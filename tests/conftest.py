"""Shared fixtures: a scratch dir per test, and a helper that lists surviving processes."""

from __future__ import annotations

import os
import sys
import time

import psutil
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = os.path.join(ROOT, "notebooks")

# Keep the tests themselves offline, like the notebooks. A test that proves the notebooks or the
# launcher go offline by themselves runs them with ``without_offline_env()`` instead.
OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


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


def skip_outside_ci(why: str) -> None:
    """Skip on a developer's machine; fail under CI, which has what the test needs (the package index, localedef,
    ruff, Chromium, `unshare -n`)."""
    if IN_CI:
        pytest.fail(f"{why} (CI=true: .ci/run must provide it)", pytrace=False)
    pytest.skip(why)


@pytest.fixture
def python() -> str:
    return sys.executable
