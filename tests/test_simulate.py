"""`--simulate-npu`: the series' NPU branch on the simulated Ascend NPU (simnpu/), labelled as simulated.

The stand-in itself (torch_npu, torch.npu, hccl over gloo, npu-smi) is tested in test_simnpu.py; here
nbtools' side: the switch adds to the user's environment and replaces nothing, every report says
"simulated", and a broken stand-in fails the series instead of passing it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import nbformat
import pytest
from conftest import NOTEBOOKS, required_ci_output

from nbtools import ParameterError, decide, simnpu_env
from nbtools.device import SIMULATED, detect, from_probe
from nbtools.session import NEEDS_REAL_NPU, Session

SIM_NPU2 = {
    "python": "3.11.7",
    "torch": "2.14.1",
    "torch_npu": "2.9.0.post2+simulated",
    "npu_simulated": True,
    "npu_available": True,
    "npu_count": 2,
    "npu_names": ["Ascend910B4", "Ascend910B4"],
}


def test_the_switch_adds_in_front_and_keeps_what_the_user_has():
    env = simnpu_env.environment(environ={"PYTHONPATH": "/mine/site", "PATH": "/usr/bin:/bin"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(simnpu_env.SIMNPU_ROOT / "site"), "/mine/site"]
    assert env["PATH"].split(os.pathsep) == [str(simnpu_env.SIMNPU_ROOT / "bin"), "/usr/bin", "/bin"]
    assert (env["SIMNPU_CARDS"], env["SIMNPU_SOC"]) == ("2", "Ascend910B4")
    assert env["ASCEND_HOME_PATH"] == str(simnpu_env.SIMNPU_ROOT / "cann")  # as CANN's set_env.sh; DeepSpeed reads it
    assert simnpu_env.environment(environ={})["PYTHONPATH"] == str(simnpu_env.SIMNPU_ROOT / "site")
    assert "ASCEND_RT_VISIBLE_DEVICES" not in env  # the user's own choice of cards, if any, stays theirs


@pytest.mark.parametrize("kwargs, words", [({"cards": 0}, "--npu-cards 0"), ({"soc": "Ascend910A"}, "--npu-soc 'Ascend910A'")])
def test_bad_knobs_say_what_is_accepted(kwargs, words):
    with pytest.raises(ParameterError, match=words):
        simnpu_env.environment(**kwargs)


def test_a_simulated_npu_is_labelled_so_and_skips_what_only_hardware_answers():
    info = from_probe(SIM_NPU2, environ={})
    assert (info.kind, info.count, info.simulated, info.real_npu) == ("npu", 2, True, False)
    assert info.label == f"{SIMULATED} x2 (Ascend910B4)" and SIMULATED in info.summary()
    assert decide.plan(info, 2).distributed_type == "MULTI_NPU" and decide.plan(info, 2).backend == "hccl"
    session = Session(info, decide.plan(info, 2), "auto", 2, 60, Path("."))
    assert session.only_on_npu("HBM").startswith(NEEDS_REAL_NPU)
    real = from_probe({**SIM_NPU2, "torch_npu": "2.9.0.post2", "npu_simulated": False}, environ={})
    assert real.real_npu and Session(real, decide.plan(real, 2), "auto", 2, 60, Path(".")).only_on_npu("HBM") is None
    cpu = from_probe({"python": "3.11.7", "torch": "2.14.1"}, environ={})
    assert Session(cpu, decide.plan(cpu, 2), "auto", 2, 60, Path(".")).only_on_npu("HBM") == "只在 NPU 上检查：HBM"


def test_the_simulated_hosts_knobs_need_the_switch():
    proc = subprocess.run([sys.executable, "-m", "nbtools", "detect", "--npu-soc", "Ascend310P3"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--npu-soc describe the simulated NPU: add --simulate-npu" in proc.stderr, proc.stderr


# --- the real thing: notebooks on the simulated NPU (a launch each; ~15 s) ---------------------


def _run(args, tmp_path, env=None, name="out"):
    out = tmp_path / name
    proc = subprocess.run(
        [sys.executable, "-m", "nbtools", "run", "--simulate-npu", *args, "--output", str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=900,
    )
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else None
    return proc, report, out


def _checks(report) -> dict[str, tuple[str, str]]:
    return {c["id"]: (c["status"], c["reason"]) for c in report["checks"] if c["notebook"]}


GATHER = os.path.join(NOTEBOOKS, "02_distributed_eval.ipynb")


@pytest.fixture(scope="module")
def simulated_series() -> Path:
    """The output folder of the README's `ci:series-simulated-npu` run, which .ci/run makes before the tests: its 02
    is the run read below."""
    return required_ci_output("simulated-npu", "series-simulated-npu")


def test_the_gather_runs_on_the_simulated_npu_and_every_report_says_so(simulated_series):
    """Read from the simulated-NPU series run (no second run of 02 here); the console's device line is held by
    tests/test_guard.py (a run on the simulated NPU through the examples guard)."""
    out = simulated_series
    report = json.loads((out / "report.json").read_text())
    assert report["device"]["simulated"] is True and report["device"]["kind"] == "npu"
    checks = _checks(report)
    assert checks["acc-gather-multi"][0] == "passed", checks
    # the quick-start's three lines, verbatim, from ranks that really ran on npu over hccl
    cells = nbformat.read(out / "02_distributed_eval.ipynb", as_version=4).cells
    executed = "".join(o.get("text", "") for c in cells for o in c.get("outputs", []))
    for line in ("world=2", "device=npu", "gathered=[1, 2, 3, 1, 2, 3]"):
        assert line in executed, line
    assert "MULTI_NPU" in executed and "hccl" in executed
    # the launch ran as the quick-start writes it, plus only Accelerate's own defaults, its config and a free port
    written = re.search(r"^\$ (ASCEND_RT_VISIBLE_DEVICES=.*gather_npu\.py)$", executed, re.M).group(1)
    real = re.search(r"^# runs here as: (.*)$", executed, re.M).group(1)
    added = list(real.split())
    for word in written.split():
        added.remove(word)
    pairs = dict(zip(added[::2], added[1::2]))
    assert len(added) == 2 * len(pairs) and set(pairs) == {
        "--num_machines", "--dynamo_backend", "--mixed_precision", "--config_file", "--main_process_port"}, real
    assert (pairs["--num_machines"], pairs["--dynamo_backend"], pairs["--mixed_precision"]) == ("1", "no", "no"), real
    assert pairs["--config_file"] == "accelerate_config_multi_npu.json" and pairs["--main_process_port"].isdigit(), real
    label = f"{SIMULATED} x2 (Ascend910B4)"
    assert label in (out / "report.md").read_text(encoding="utf-8")
    assert label in (out / "index.html").read_text(encoding="utf-8")
    props = {p.get("name"): p.get("value") for p in ET.parse(out / "junit.xml").getroot().iter("property")}
    assert props["device"] == label
    result = json.loads((out / "result.json").read_text(encoding="utf-8"))  # Ascend's examples-guard record
    assert result["job_status"] == "success" and "02_distributed_eval.ipynb" in result["path"].split(), result["path"]
    assert result["device"] == {"kind": "npu", "count": 2, "names": ["Ascend910B4"] * 2, "simulated": True}
    assert result["versions"]["torch_npu"].endswith("+simulated") and {"trigger", "target_repo", "image"} <= set(result)


def test_an_allgather_that_keeps_only_the_local_tensor_fails_the_gather_check(tmp_path):
    proc, report, out = _run([GATHER], tmp_path, env={"SIMNPU_FAULT": "allgather_local"})
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert _checks(report)["acc-gather-multi"][0] == "failed", _checks(report)
    assert json.loads((out / "result.json").read_text(encoding="utf-8"))["job_status"] == "failure"


def test_ranks_that_see_one_card_do_not_pass_as_two(tmp_path):
    """The probe saw two cards; the ranks see one (a stand-in whose device count broke): the 2-process
    launch of the quick-start must fail its check, not pass as 2 ranks."""
    from nbtools.runner import run_notebooks

    sim = simnpu_env.environment()
    saved = dict(os.environ)
    os.environ.update(sim)
    try:
        info = detect(refresh=True)  # healthy: two simulated cards
        assert info.simulated and info.count == 2, info.summary()
        os.environ["SIMNPU_FAULT"] = "one_device"  # from here on, what the kernels and ranks see
        report = run_notebooks([Path(NOTEBOOKS) / "01_training.ipynb"], tmp_path / "out", info=info)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    statuses = {c.id: c.status for c in report.checks if c.notebook}
    assert statuses["acc-launch"] == "failed", statuses
