"""Shared-host hygiene: concurrent runs, no trace left behind, bad parameters before any process,
and a run stopped by a signal mid-launch leaves nothing running."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import NOTEBOOKS


def test_two_runs_at_once_both_pass_and_leave_no_trace(tmp_path):
    """Two `nbtools run` started at the same moment: separate work dirs, ports and kernels;
    afterwards the temp dir they used is empty again (work dirs are removed)."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = dict(os.environ, TMPDIR=str(tmpdir))
    nb = str(Path(NOTEBOOKS) / "02_distributed_eval.ipynb")
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "nbtools", "run", nb, "--output", str(tmp_path / f"out{i}")],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in (1, 2)
    ]
    outputs = [p.communicate(timeout=900)[0] for p in procs]
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out[-3000:]
    ports = []  # the rendezvous ports each run's launches used
    for i in (1, 2):
        report = json.loads((tmp_path / f"out{i}" / "report.json").read_text())
        assert report["summary"]["ok"]
        executed = (tmp_path / f"out{i}" / "02_distributed_eval.ipynb").read_text()
        ports.append(set(re.findall(r"--main_process_port (\d+)", executed)))
    assert all(ports), f"a run shows no launch port: {ports}"
    assert not ports[0] & ports[1], f"the two runs shared a rendezvous port: {ports}"
    leftovers = sorted(str(p.relative_to(tmpdir)) for p in tmpdir.rglob("*"))
    assert leftovers == [], f"left behind in TMPDIR: {leftovers[:20]}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out1", "out2", "tmp"]


# --- a stop signal to `python -m nbtools run` while a notebook is mid-launch -----------------


def _stop_series(tmp_path: Path, marker: str, stubborn: bool = False) -> Path:
    """00 launches a quiet child (`nbtools.run`, sleeping); 01 would run after it."""
    from test_runner import make_nb

    d = tmp_path / "nbs"
    d.mkdir()
    ignore = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)  # a cell deaf to interrupts\n"
    make_nb(
        d / "00_launch.ipynb",
        [
            ("work_dir = ''\n", ["parameters"]),
            ((ignore if stubborn else "") + "import sys, nbtools\n"
             f"nbtools.run_command([sys.executable, '-c', 'import time; time.sleep(600)  # {marker}'], timeout=900)", []),
            ("print('after the launch')", []),
        ],
    )
    make_nb(d / "01_next.ipynb", [("print('the next notebook')", [])])
    return d


def _alive(procs) -> list:
    from nbtools.proctree import is_alive

    return [p for p in procs if is_alive(p)]


def _stop_mid_launch(tmp_path: Path, signals: list[str], stubborn: bool = False):
    """Start a run, wait for the launched child, send ``signals`` (0.5 s apart); return what is left."""
    import signal
    import time
    import uuid

    import psutil
    from conftest import processes_mentioning, wait_gone

    marker = f"nbtools-stop-test-{uuid.uuid4().hex}"
    nbs = _stop_series(tmp_path, marker, stubborn)
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "nbtools", "run", str(nbs), "--output", str(out)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, encoding="utf-8",
    )
    try:
        deadline = time.monotonic() + 180
        while not processes_mentioning(marker):
            assert proc.poll() is None and time.monotonic() < deadline, "the launch never started"
            time.sleep(0.2)
        time.sleep(0.5)
        tree = psutil.Process(proc.pid).children(recursive=True)  # the kernel, the guardian, the child
        assert len(tree) >= 2, tree
        sent = time.monotonic()
        for i, name in enumerate(signals):
            if i:
                time.sleep(0.5)
            proc.send_signal(getattr(signal, name))
        stdout, _ = proc.communicate(timeout=60)
        left = wait_gone(marker, timeout=max(0.0, 10 - (time.monotonic() - sent)))
        left_tree = _alive(tree)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, stdout, out, left, left_tree


@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_signal_to_run_stops_the_kernel_and_its_launch(name, tmp_path):
    import signal

    rc, stdout, out, left, left_tree = _stop_mid_launch(tmp_path, [name])
    assert left == [], f"the launch outlived the run 10 s after {name}: {left}\n{stdout[-3000:]}"
    assert left_tree == [], f"left of the run's kernel: {left_tree}\n{stdout[-3000:]}"
    assert rc == 128 + getattr(signal, name), stdout[-3000:]
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))  # it wrote what it had
    assert report["stopped_by"] == name and report["summary"]["ok"] is False
    first, second = report["notebooks"]
    assert first["status"] == "failed" and first["error"].startswith(f"被 {name} 停止"), first
    assert second["status"] == "not-run" and name in second["error"], second
    assert (out / "00_launch.ipynb").is_file() and (out / "junit.xml").is_file()
    assert f"STOPPED by {name}" in stdout
    assert json.loads((out / "result.json").read_text(encoding="utf-8"))["job_status"] == "cancelled"  # the guard's word


def test_a_cell_deaf_to_interrupts_is_killed_after_the_grace_period(tmp_path):
    rc, stdout, out, left, left_tree = _stop_mid_launch(tmp_path, ["SIGTERM"], stubborn=True)
    assert left == [] and left_tree == [], (left, left_tree, stdout[-3000:])
    assert rc == 143 and "did not stop within" in stdout, stdout[-3000:]


def test_a_second_ctrl_c_kills_at_once(tmp_path):
    rc, stdout, out, left, left_tree = _stop_mid_launch(tmp_path, ["SIGINT", "SIGINT"], stubborn=True)
    assert left == [] and left_tree == [], (left, left_tree, stdout[-3000:])
    assert rc == 130 and "SIGINT again: killing the kernel now" in stdout, stdout[-3000:]
    assert "did not stop within" not in stdout


def test_sigkill_to_run_leaves_no_kernel_nor_launch(tmp_path):
    """Nothing can be done on SIGKILL: the kernels (the running one and the one started ahead)
    notice their parent is gone, and the launch's guardian notices its kernel is gone."""
    import time

    rc, stdout, _, left, left_tree = _stop_mid_launch(tmp_path, ["SIGKILL"])
    deadline = time.monotonic() + 10
    while left_tree and time.monotonic() < deadline:
        time.sleep(0.2)
        left_tree = _alive(left_tree)
    assert rc == -9, stdout[-3000:]
    assert left == [] and left_tree == [], (left, left_tree, stdout[-3000:])


def test_the_next_kernel_starts_while_the_notebook_before_runs(tmp_path):
    """The runner starts notebook N+1's kernel when N starts; it is a fresh kernel, in its own
    notebook's folder, with the runner's environment, and nothing ran in it before its first cell."""
    from test_runner import make_nb

    d = tmp_path / "nbs"
    (d / "sub").mkdir(parents=True)
    ended = tmp_path / "first-ended"
    make_nb(d / "00_first.ipynb", [(f"import time\ntime.sleep(3)\nopen({str(ended)!r}, 'w').write(repr(time.time()))", [])])
    make_nb(
        d / "sub" / "01_second.ipynb",
        [("import json, os, sys, psutil\nprint(json.dumps({'born': psutil.Process().create_time(), 'cwd': os.getcwd(), "
          "'unattended': os.environ.get('NBTOOLS_UNATTENDED'), 'names': sorted(k for k in globals() if not k.startswith('_')), "
          "'pyplot': 'matplotlib.pyplot' in sys.modules}))", [])],
    )
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "nbtools", "run", str(d / "00_first.ipynb"), str(d / "sub" / "01_second.ipynb"),
         "--output", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert [n["status"] for n in report["notebooks"]] == ["passed", "passed"], proc.stdout[-3000:]
    second = json.loads((out / "01_second.ipynb").read_text(encoding="utf-8"))
    seen = json.loads("".join(second["cells"][1]["outputs"][0]["text"]))
    assert seen["born"] < float(ended.read_text()) - 1, "the second kernel started only after the first notebook"
    assert seen["cwd"] == str(d / "sub") and seen["unattended"] == "1", seen
    ipython_own = {"In", "Out", "exit", "quit", "get_ipython", "open"}
    assert set(seen["names"]) - {"json", "os", "psutil", "sys"} <= ipython_own, seen["names"]
    # the kernel started ahead imported matplotlib as it booted; the cell is still the kernel's first
    assert seen["pyplot"] is True and second["cells"][1]["execution_count"] == 1, seen
