"""Execute the real notebook series on this machine's CPU, as CI and learners do."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from conftest import NOTEBOOKS, ROOT, isolated_prefix, on_its_own, skip_outside_ci, without_offline_env

from nbtools import detect
from nbtools.checks import SEED_CHECKS, check_ids
from nbtools.runner import judge_checks

pytestmark = pytest.mark.notebook


def _git_status() -> str:
    return subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def series_run(tmp_path_factory):
    """The whole series, once, with the network refused when the machine allows it, and without
    any Hugging Face offline switch in its environment: the notebooks must set what they need."""
    out = tmp_path_factory.mktemp("series-out")
    before = _git_status()
    with on_its_own() as prefix:
        proc = subprocess.run(
            [*prefix, sys.executable, "-m", "nbtools", "run", NOTEBOOKS, "--output", str(out)],
            capture_output=True,
            text=True,
            timeout=1500,
            cwd=tmp_path_factory.mktemp("elsewhere"),
            env=without_offline_env(),
        )
    return proc, out, before, bool(prefix)


def test_series_passes_with_only_the_source_install_skipped(series_run):
    proc, out, _, _ = series_run
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
    info = detect()
    assert (report["device"]["kind"], report["device"]["count"]) == (info.kind, info.count)


def test_series_leaves_the_work_tree_unchanged(series_run):
    _, _, before, _ = series_run
    assert _git_status() == before


def test_series_needs_no_network(series_run):
    """A default run makes no network request: it passed inside a namespace with loopback only."""
    _, _, _, offline = series_run
    if not offline:
        skip_outside_ci("cannot refuse network access here (`unshare -n` needs root): offline run not proven")
    probe = subprocess.run(
        [*isolated_prefix(), sys.executable, "-c", "import socket; socket.create_connection(('pypi.org', 443), timeout=5)"],
        capture_output=True,
        text=True,
    )
    assert probe.returncode != 0, "the namespace still reaches the network: the offline proof is void"


# The series run above already executes every notebook alone in a fresh kernel (cwd = its folder);
# these add papermill's own CLI started elsewhere (cwd = the caller's), for a notebook without a
# launch, one with a launch, and one with two concurrent launches.
def expected_verdicts(nb) -> dict[str, tuple[str, ...]]:
    """Each check id of a notebook -> the verdicts it may end with here: a seed check passes (the
    source install skips: it needs the network), an extra check passes or skips with its reason."""
    out = {}
    for cell in nb.cells:
        for cid in check_ids(cell.get("metadata", {}).get("tags")):
            if cid == "acc-install-source":
                out[cid] = ("skipped",)
            else:
                out[cid] = ("passed",) if cid in SEED_CHECKS else ("passed", "skipped")
    return out


@pytest.mark.parametrize("name", ["00_environment.ipynb", "02_distributed_eval.ipynb", "06_multi_node.ipynb"])
def test_notebook_passes_alone_under_plain_papermill_from_another_dir(name, tmp_path):
    """papermill's own CLI, started elsewhere, without --cwd, without nbtools run's environment
    (no NBTOOLS_UNATTENDED, no offline switches): every check of the notebook gives its verdict."""
    source = Path(NOTEBOOKS) / name
    expected = expected_verdicts(nbformat.read(source, as_version=4))
    assert expected, f"{name} has no check cells"
    out = tmp_path / name
    env = {k: v for k, v in without_offline_env().items() if not k.startswith("NBTOOLS_")}
    proc = subprocess.run(
        [sys.executable, "-m", "papermill", str(source), str(out), "-k", "python3", "--no-progress-bar"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = {c.id: c for c in judge_checks(nbformat.read(out, as_version=4), name)}
    assert set(got) == set(expected)
    for cid, allowed in expected.items():
        assert got[cid].status in allowed, (cid, got[cid])
        assert got[cid].status != "skipped" or got[cid].reason, (cid, "a skip needs its reason")


def test_the_pictures_are_drawn_and_shown_in_the_html_report(series_run):
    """At least four notebooks draw from the run's own numbers, and each picture is in its HTML page."""
    _, out, _, _ = series_run
    drawn = {}
    for path in sorted(out.glob("*.ipynb")):
        pngs = [
            o["data"]["image/png"]
            for c in nbformat.read(path, as_version=4).cells
            for o in c.get("outputs", [])
            if "image/png" in o.get("data", {})
        ]
        if pngs:
            drawn[path] = pngs
    assert len(drawn) >= 4, f"only {[p.name for p in drawn]} draw"
    for path, pngs in drawn.items():
        page = (out / f"{path.stem}.html").read_text(encoding="utf-8")
        for png in pngs:
            assert png.strip()[:200] in page, f"{path.stem}.html lacks one of the notebook's pictures"
