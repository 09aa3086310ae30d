"""check-py asks the `python` a learner's terminal would run (the first on PATH), not the kernel's own interpreter:
a fake `python` first on PATH below the floor, or one that cannot import the kernel's torch and Accelerate, fails the
check with what to do; another interpreter that meets both passes and is named. The check cell itself is run."""

from __future__ import annotations

import os
import platform
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from conftest import NOTEBOOKS, skip_outside_ci

import nbtools
from nbtools import floors
from nbtools.doctor import terminal_python


def fake_python(folder: Path, version: str, torch: str, accelerate: str, prefix: str = "/opt/other") -> str:
    """A `python` that answers the terminal probe as an interpreter with these versions would."""
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / "python"
    exe.write_text("#!/bin/sh\n" + "".join(f"echo '{k}= {v}'\n" for k, v in [
        ("python", version), ("executable", f"{prefix}/bin/python"), ("prefix", prefix), ("torch", torch),
        ("accelerate", accelerate)]))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return str(folder)


def check_cell() -> str:
    nb = nbformat.read(Path(NOTEBOOKS) / "00_environment.ipynb", as_version=4)
    return next(c.source for c in nb.cells if "check:check-py" in c.metadata.get("tags", []))


class _Run:
    output = f"Python {platform.python_version()}\n"  # what `%cmd python --version` printed (the kernel's python)


def run_check(monkeypatch, capsys, path: str) -> str:
    monkeypatch.setenv("PATH", path)
    exec(check_cell(), {"nbtools": nbtools, "sys": sys, "os": os, "platform": platform, "r_py": _Run(),
                        "terminal_python": terminal_python})
    return capsys.readouterr().out


KERNEL = {"torch": nbtools.installed("torch"), "accelerate": nbtools.installed("accelerate")}


def test_a_python_below_the_floor_fails_with_the_fix(tmp_path, monkeypatch, capsys):
    path = fake_python(tmp_path / "old", "3.9.18", KERNEL["torch"], KERNEL["accelerate"])
    with pytest.raises(AssertionError) as err:
        run_check(monkeypatch, capsys, path)
    said = str(err.value)
    assert f"Python 3.9.18，低于本系列的最低版本 {floors.PYTHON}" in said and "export PATH=" in said, said
    assert str(Path(sys.executable).parent) in said  # the fix names the kernel's folder to put first


def test_a_python_without_the_kernels_torch_and_accelerate_fails_with_the_fix(tmp_path, monkeypatch, capsys):
    path = fake_python(tmp_path / "bare", "3.12.1", "not importable: ModuleNotFoundError", KERNEL["accelerate"])
    with pytest.raises(AssertionError) as err:
        run_check(monkeypatch, capsys, path)
    said = str(err.value)
    assert f"导入不了内核的 torch {KERNEL['torch']}" in said and "not importable: ModuleNotFoundError" in said, said
    assert "accelerate" not in said.split("（它那里")[0], "only what differs is named"
    assert "export PATH=" in said and "激活内核的环境" in said, said


def test_another_python_with_the_same_torch_and_accelerate_passes_and_names_both(tmp_path, monkeypatch, capsys):
    path = fake_python(tmp_path / "other", "3.12.1", KERNEL["torch"] + "+cpu", KERNEL["accelerate"])
    said = run_check(monkeypatch, capsys, path)
    assert said.startswith("[check] PASSED check-py -- "), said
    assert "是另一个解释器 /opt/other/bin/python（Python 3.12.1）" in said and f"内核是 {sys.executable}" in said, said


def test_the_kernels_own_python_first_on_path_passes(monkeypatch, capsys):
    said = run_check(monkeypatch, capsys, f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    assert said.startswith("[check] PASSED check-py -- ") and "终端的 python 就是内核的解释器" in said, said


def test_no_python_on_path_fails_with_the_fix(tmp_path, monkeypatch, capsys):
    with pytest.raises(AssertionError, match="终端里没有 `python`"):
        run_check(monkeypatch, capsys, str(tmp_path))


def test_a_real_python_below_the_floor_first_on_path_fails(tmp_path, monkeypatch, capsys):
    """The same with a real interpreter (CI has python3.9 for tests/test_install.py): `python` -> Python 3.9."""
    if shutil.which("python3.9") is None:
        skip_outside_ci("no python3.9 here (CI provides one through pyenv)")
    real = subprocess.run(["python3.9", "-c", "import sys; print(sys.executable)"], capture_output=True, text=True)
    if real.returncode != 0:
        skip_outside_ci(f"python3.9 does not run here: {real.stderr.strip()[-200:]}")
    (tmp_path / "python").symlink_to(real.stdout.strip())
    with pytest.raises(AssertionError, match=r"Python 3\.9\.\d+，低于本系列的最低版本"):
        run_check(monkeypatch, capsys, str(tmp_path))
