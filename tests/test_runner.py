"""The runner on small synthetic notebooks (real papermill, real kernels)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from nbtools.checks import SEED_CHECKS
from nbtools.runner import parse_params


def make_nb(path: Path, cells: list[tuple[str, list[str]]]) -> Path:
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells.append(new_markdown_cell("# test"))
    for src, tags in cells:
        nb.cells.append(new_code_cell(src, metadata={"tags": tags}))
    nbformat.write(nb, path)
    return path


PARAMS = ("device = 'auto'\nnum_processes = 2\nwork_dir = ''\n", ["parameters"])


def run_cli(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nbtools", "run", *args], capture_output=True, text=True, timeout=600, cwd=cwd
    )


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    d = tmp_path_factory.mktemp("series")
    make_nb(
        d / "00_good.ipynb",
        [
            PARAMS,
            ("import os, nbtools\nprint('cwd=' + os.getcwd())\nprint('np=' + str(num_processes))\n"
             "print('wd=' + work_dir)", []),
            ("assert num_processes == 3\nnbtools.passed('check-py', 'ok')", ["check:check-py"]),
            ("nbtools.skipped('acc-install-source', 'needs the network')", ["check:acc-install-source"]),
            ("print('no verdict here')", ["check:extra-silent"]),
        ],
    )
    make_nb(
        d / "01_bad.ipynb",
        [
            PARAMS,
            ("import nbtools\nassert 1 + 1 == 3, 'arithmetic is broken'\nnbtools.passed('acc-launch')", ["check:acc-launch"]),
            ("nbtools.passed('acc-prepare')", ["check:acc-prepare"]),
        ],
    )
    make_nb(
        d / "02_exit.ipynb",
        [
            PARAMS,
            ("import sys\nsys.exit(0)", []),
            ("import nbtools\nnbtools.passed('acc-env')", ["check:acc-env"]),
        ],
    )
    out = tmp_path_factory.mktemp("out")
    proc = run_cli(str(d), "-p", "num_processes=3", "--output", str(out), cwd=tmp_path_factory.mktemp("elsewhere"))
    report = json.loads((out / "report.json").read_text())
    return d, out, proc, report


def test_exit_code_is_non_zero_when_anything_failed(series):
    _, _, proc, report = series
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert report["summary"]["ok"] is False


def test_notebook_statuses_include_sys_exit_as_failed(series):
    _, _, _, report = series
    by = {n["path"]: n for n in report["notebooks"]}
    assert by["00_good.ipynb"]["status"] == "passed"
    assert by["01_bad.ipynb"]["status"] == "failed" and "arithmetic is broken" in by["01_bad.ipynb"]["error"]
    assert by["02_exit.ipynb"]["status"] == "failed" and "never ran" in by["02_exit.ipynb"]["error"]
    assert all(n["duration_s"] > 0 for n in report["notebooks"])


def test_check_statuses(series):
    _, _, _, report = series
    by = {c["id"]: c for c in report["checks"]}
    assert by["check-py"]["status"] == "passed" and by["check-py"]["notebook"] == "00_good.ipynb"
    assert by["acc-install-source"] == {
        "id": "acc-install-source", "status": "skipped", "notebook": "00_good.ipynb",
        "reason": "needs the network", "seed": True,
    }
    assert by["extra-silent"]["status"] == "failed" and "no verdict" in by["extra-silent"]["reason"]
    assert by["acc-launch"]["status"] == "failed" and "AssertionError" in by["acc-launch"]["reason"]
    assert by["acc-prepare"]["status"] == "failed" and "not run" in by["acc-prepare"]["reason"]
    assert by["acc-env"]["status"] == "failed"
    # every seed id has an entry; those no cell claims are 'missing'
    assert set(SEED_CHECKS) <= set(by)
    assert by["acc-dispatch"]["status"] == "missing"


def test_parameters_injected_and_cwd_is_the_notebook_folder(series):
    d, out, _, _ = series
    nb = nbformat.read(out / "00_good.ipynb", as_version=4)
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert f"cwd={d}" in text
    assert "np=3" in text
    assert "wd=/" in text  # the runner hands every notebook a private work dir


def test_report_files(series):
    _, out, proc, report = series
    assert {"report.json", "report.md", "junit.xml", "00_good.ipynb"} <= {p.name for p in out.iterdir()}
    assert report["device"]["kind"] == "cpu"
    md = (out / "report.md").read_text()
    assert "| acc-install-source | skipped | 00_good.ipynb | needs the network |" in md
    junit = (out / "junit.xml").read_text()
    assert 'failures="' in junit and "<skipped" in junit


def test_unknown_parameter_is_refused_before_running(tmp_path):
    make_nb(tmp_path / "00_x.ipynb", [PARAMS])
    proc = run_cli(str(tmp_path), "-p", "num_proceses=2", "--output", str(tmp_path / "o"))
    assert proc.returncode == 2
    assert "num_proceses not declared by any notebook; declared: device, num_processes, work_dir" in proc.stderr


def test_parse_params_types():
    assert parse_params(["a=2", "b=bf16", "c=true", "d=", "e=1.5"]) == {"a": 2, "b": "bf16", "c": True, "d": "", "e": 1.5}
