"""One place per rule: each rule below is changed in its one home, and every user is seen to follow."""

from __future__ import annotations

import sys
import time

import pytest

from nbtools import proctree
from nbtools.errors import LaunchTimeout
from nbtools.guarded import run_command

IGNORES_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"


def test_the_stop_grace_has_one_home(monkeypatch):
    """proctree.GRACE (SIGTERM, then SIGKILL that much later) is what the guardian of a launch waits: a command that
    ignores SIGTERM and runs past its timeout is killed GRACE after it, with GRACE changed in proctree alone."""
    monkeypatch.setattr(proctree, "GRACE", 0.5)
    start = time.monotonic()
    with pytest.raises(LaunchTimeout, match="up"):
        run_command([sys.executable, "-c", IGNORES_TERM], timeout=1.5, echo=False)
    took = time.monotonic() - start
    assert took < 1.5 + 3.5, f"stopped after {took:.1f} s: the guardian did not take proctree.GRACE (0.5 s)"
