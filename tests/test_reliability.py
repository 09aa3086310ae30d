"""Shared-host hygiene: concurrent runs, no trace left behind, bad parameters before any process."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

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


def test_bad_parameter_stops_the_notebook_before_any_process(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "nbtools", "run", str(Path(NOTEBOOKS) / "01_training.ipynb"),
         "-p", "num_processes=0", "--output", str(out)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert proc.returncode == 1
    report = json.loads((out / "report.json").read_text())
    (nb,) = report["notebooks"]
    assert "ParameterError" in nb["error"] and "num_processes=0" in nb["error"] and "integer >= 1" in nb["error"]
    executed = json.loads((out / "01_training.ipynb").read_text())
    ran = [c for c in executed["cells"] if c["cell_type"] == "code" and c.get("execution_count")]
    # injected parameters, parameters, and the failing setup cell: no launch ever started
    assert len(ran) == 3
    assert "accelerate launch" not in json.dumps(ran)
