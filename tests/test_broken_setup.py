"""The commonest broken Ascend setup, for real: torch_npu from the package index beside the
matching torch, without CANN. `import torch` itself then fails. The wheel is put on
PYTHONPATH (a --target dir), so the project's environment stays untouched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata

import nbformat
import pytest
from conftest import NOTEBOOKS, on_its_own, skip_outside_ci
from packaging.version import Version

from nbtools.checks import SEED_CHECKS


@pytest.fixture(scope="module")
def broken_env(tmp_path_factory):
    # The newest torch-npu for this torch's major.minor (torch 2.14.1 has torch-npu 2.14.0, not 2.14.1).
    major, minor = Version(metadata.version("torch")).release[:2]
    wanted = f"torch-npu>={major}.{minor},<{major}.{minor + 1}"
    site = tmp_path_factory.mktemp("npusite")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), wanted],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        # CI reaches the package index: the broken setup must be reproduced there
        skip_outside_ci(f"{wanted} could not be installed from the package index: {proc.stderr[-300:]}")
    env = dict(os.environ, PYTHONPATH=str(site))
    env.pop("NBTOOLS_DEVICE_PROBE", None)
    check = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True)
    assert check.returncode != 0 and "torch_npu" in check.stderr, "the broken setup did not reproduce"
    return env


def test_importing_nbtools_never_crashes(broken_env):
    proc = subprocess.run(
        [sys.executable, "-c", "import nbtools; i = nbtools.detect(); print(i.healthy, i.kind)"],
        env=broken_env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False cpu"


def test_doctor_names_the_cause_and_the_fix(broken_env):
    proc = subprocess.run(
        [sys.executable, "-m", "nbtools", "doctor"], env=broken_env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1
    assert "[FAIL] setup" in proc.stdout and "torch_npu is installed but cannot load" in proc.stdout
    # no CANN on this machine: both places a CANN release puts set_env.sh, and where to look
    assert "source /usr/local/Ascend/cann/set_env.sh" in proc.stdout and "ascend-toolkit/set_env.sh" in proc.stdout
    assert "/etc/Ascend/ascend_cann_install.info" in proc.stdout


def test_run_stops_at_the_first_cell_and_marks_the_rest_not_run(broken_env, tmp_path):
    out = tmp_path / "out"
    with on_its_own() as prefix:
        proc = subprocess.run(
            [*prefix, sys.executable, "-m", "nbtools", "run", NOTEBOOKS, "--output", str(out)],
            env=broken_env, capture_output=True, text=True, timeout=600, cwd=tmp_path,
        )
    assert proc.returncode == 1, proc.stdout
    report = json.loads((out / "report.json").read_text())
    notebooks = report["notebooks"]
    # The orientation notebook teaches the fix, so it runs anyway and shows the problem...
    orient = notebooks[0]
    assert orient["path"] == "00_ascend_jupyterlab.ipynb" and orient["status"] == "passed", orient
    shown = nbformat.read(out / orient["path"], as_version=4)
    texts = "".join(o.get("text", "") for c in shown.cells for o in c.get("outputs", []))
    assert "PROBLEM（问题）：torch_npu is installed but cannot load" in texts and "set_env.sh" in texts
    # ...and the first notebook that needs torch stops the run, naming the fix.
    first, *rest = notebooks[1:]
    assert first["path"] == "00_environment.ipynb" and first["status"] == "failed"
    assert "DeviceError" in first["error"] and "set_env.sh" in first["error"]
    assert rest and all(n["status"] == "not-run" and "set_env.sh" in n["error"] for n in rest)
    seed = [c for c in report["checks"] if c["seed"]]
    assert [c["id"] for c in seed] == list(SEED_CHECKS)
    assert all(c["status"] == "failed" for c in seed), seed
    # the executed 00 shows the error in its first code cell after the parameters
    nb = json.loads((out / "00_environment.ipynb").read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    executed = [c for c in code if c.get("execution_count")]
    errors = [o for c in executed for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert errors and errors[0]["ename"] == "DeviceError"
    assert len(executed) <= 3  # injected parameters, parameters, setup: nothing after the failure


def test_a_fresh_clone_gets_the_one_install_command_from_00s_first_code_cell(tmp_path):
    """A kernel without this repository installed: 00_ascend_jupyterlab's first code cell stops with the command
    to run (tools/install.py, with this kernel's interpreter), not with a bare ImportError."""
    nb = nbformat.read(os.path.join(NOTEBOOKS, "00_ascend_jupyterlab.ipynb"), as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "code" and "parameters" not in c.metadata.get("tags", []))
    head = first.source.split("\nfrom nbtools", 1)[0]  # the imports and the guarded `import nbtools`
    proc = subprocess.run([sys.executable, "-S", "-c", head], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "ModuleNotFoundError: 本仓库还没装进这个内核的环境" in proc.stderr, proc.stderr
    assert f"{sys.executable} tools/install.py" in proc.stderr, proc.stderr
