"""Execute the real notebook series on this machine's CPU, as CI and learners do."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import NOTEBOOKS, ROOT

from nbtools.checks import SEED_CHECKS

pytestmark = pytest.mark.notebook


def _git_status() -> str:
    return subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def series_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("series-out")
    before = _git_status()
    proc = subprocess.run(
        [sys.executable, "-m", "nbtools", "run", NOTEBOOKS, "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=1500,
        cwd=tmp_path_factory.mktemp("elsewhere"),
    )
    return proc, out, before


def test_series_passes_with_only_the_source_install_skipped(series_run):
    proc, out, _ = series_run
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads((out / "report.json").read_text())
    seed = {c["id"]: c for c in report["checks"] if c["seed"]}
    assert list(seed) == list(SEED_CHECKS)
    for cid, c in seed.items():
        if cid == "acc-install-source":
            assert c["status"] == "skipped" and "accelerate_ref" in c["reason"], c
        else:
            assert c["status"] == "passed", c
    assert all(n["status"] == "passed" for n in report["notebooks"])
    assert report["device"]["kind"] == "cpu"


def test_series_leaves_the_work_tree_unchanged(series_run):
    _, _, before = series_run
    assert _git_status() == before


@pytest.mark.parametrize("name", ["00_environment.ipynb", "02_distributed_eval.ipynb"])
def test_notebook_passes_alone_under_plain_papermill_from_another_dir(name, tmp_path):
    """papermill's own CLI, started elsewhere, without --cwd: the notebook must not depend on it."""
    out = tmp_path / name
    proc = subprocess.run(
        [sys.executable, "-m", "papermill", str(Path(NOTEBOOKS) / name), str(out), "-k", "python3", "--no-progress-bar"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "[check] PASSED" in out.read_text()
