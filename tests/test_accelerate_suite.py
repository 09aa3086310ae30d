"""Accelerate's own test suite on the simulated NPU: a file of its own (a long test), so that xdist runs it beside the
rest of tests/test_simnpu.py (tests/conftest.py)."""

from __future__ import annotations

import os
import re
import sys

from conftest import ROOT, skip_outside_ci
from test_simnpu import run

SUITE_FILES = ["test_big_modeling", "test_hooks", "test_modeling_utils", "test_multidevice"]


def test_accelerates_own_suite_passes_on_the_stand_in(tmp_path):
    """Accelerate's own tests of offload, dispatch, hooks, FSDP1 wrapping and DDP (from the installed release's
    sdist, bench/accelerate_suite.py) fail on the stand-in only where its README names the difference."""
    r = run([sys.executable, os.path.join(ROOT, "bench", "accelerate_suite.py"), "--only", "sim",
             "--fail-on-sim-failures", "--junit-dir", str(tmp_path), "--files", *SUITE_FILES],
            dict(os.environ), tmp_path, timeout=900)
    if r.returncode == 2:
        skip_outside_ci(f"accelerate's sdist could not be downloaded: {r.stdout[-300:]}")
    assert r.returncode == 0, r.stdout[-6000:]
    table = r.stdout[r.stdout.index("test file"):]
    for name in SUITE_FILES:
        assert re.search(rf"^{name}\s+\|\s+[1-9]\d*\s", table, re.M), table  # each file ran tests
