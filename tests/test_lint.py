"""Lint: ruff (rules in pyproject.toml) is clean over the package, the bench, the tests and the notebooks."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT


def test_ruff_is_clean():
    ruff = shutil.which("ruff", path=os.path.dirname(sys.executable)) or shutil.which("ruff")
    if ruff is None:
        if os.environ.get("CI"):
            pytest.fail("ruff is not installed: pip install -r requirements-dev.txt")
        pytest.skip("ruff is not installed (pip install -r requirements-dev.txt)")
    proc = subprocess.run(
        [ruff, "check", "--output-format", "concise", "nbtools", "bench", "tests", "notebooks"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
