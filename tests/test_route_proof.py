"""The card count decides (issues 48 and 50): the learner's own job shrinks to the visible cards (``--fit``), and
the launch checks' expectations come from the probe, never from the plan that chose the route."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import NOTEBOOKS, ci_output

from nbtools import decide, guarded, session
from nbtools.device import from_probe
from nbtools.guarded import LaunchOptions

CPU = {"python": "3.12.1", "torch": "2.9.0"}
NPU2 = {"python": "3.12.1", "torch": "2.9.0", "torch_npu": "2.9.0.post2", "cann": "9.1.0", "npu_available": True,
        "npu_count": 2, "npu_names": ["Ascend910B4"] * 2}
NPU1 = dict(NPU2, npu_count=1, npu_names=["Ascend910B4"])
CUDA1 = {"python": "3.12.1", "torch": "2.9.0", "cuda_available": True, "cuda_count": 1, "cuda_names": ["H200"]}


def info(probe):
    return from_probe(probe, environ={})


def sess(probe, device="auto", n=2, tmp_path="."):
    i = info(probe)
    return session.Session(i, decide.plan(i, n, device), device, n, 600, tmp_path)


def spec(text, probe, tmp_path):
    call = decide.parse_launch(text)
    return decide.launch_spec(call, info=info(probe), cwd=tmp_path, fit=call.command.fit)


def test_the_learners_job_shrinks_to_the_visible_cards_and_says_so(tmp_path):
    fitted = spec("--fit accelerate launch --num_processes 2 --mixed_precision bf16 t.py", NPU1, tmp_path)
    assert (fitted.kind, fitted.num_processes, fitted.cards) == ("npu", 1, ("0",))
    assert "学员自己的任务：要 2 个进程，只看得见 1 张 NPU：用 1 个进程，在 npu:0 上" in fitted.why
    shown = fitted.shown(None)
    assert "--num_processes 1" in shown and "ACCELERATE_USE_CPU" not in shown and "ASCEND_RT_VISIBLE_DEVICES=0 " in shown
    cuda = spec("--fit accelerate launch --num_processes 4 t.py", CUDA1, tmp_path)
    assert cuda.cards == ("0",) and "只看得见 1 张 CUDA：用 1 个进程，在 cuda:0 上" in cuda.why
    # without --fit the seed's rule holds: N ranks on the labelled CPU stand-in
    seed = spec("accelerate launch --num_processes 2 t.py", NPU1, tmp_path)
    assert seed.fallback and "ACCELERATE_USE_CPU=1" in seed.shown(None)


@pytest.mark.parametrize("probe, device", [(CPU, "auto"), (NPU2, "auto"), (NPU1, "cpu")])
def test_fit_changes_nothing_on_a_cpu_or_with_enough_cards(tmp_path, probe, device):
    call = decide.parse_launch("accelerate launch --num_processes 2 t.py")
    plain = decide.launch_spec(call, info=info(probe), device=device, cwd=tmp_path)
    fitted = decide.launch_spec(call, info=info(probe), device=device, cwd=tmp_path, fit=True)
    assert (fitted, fitted.why, fitted.shown(1)) == (plain, plain.why, plain.shown(1))
    assert sess(probe, device).fitted(2) == 2


def test_fitted_counts_from_the_probe_and_fit_is_a_launch_option(monkeypatch, tmp_path):
    assert [sess(p).fitted(n) for p, n in ((NPU1, 2), (NPU1, 1), (NPU2, 8), (CUDA1, 2))] == [1, 1, 2, 1]
    with pytest.raises(Exception, match="--fit are %launch options"):
        from nbtools.magics import run_written
        run_written("--fit python --version")
    seen = []
    monkeypatch.setattr(guarded, "launch", lambda s, **kw: seen.append(s))
    guarded.accelerate_launch("t.py", options=LaunchOptions(fit=True, info=info(NPU1), cwd=tmp_path))
    assert seen[0].num_processes == 1 and seen[0].kind == "npu"


# ---------------------------------------------------------------- expectations from the probe, never the plan


def test_expect_comes_from_the_probe_and_the_device_parameter(monkeypatch):
    monkeypatch.setattr(session, "plan", lambda *a, **k: pytest.fail("S.expect asked the route"))
    s = session.Session(info(NPU2), None, "auto", 2, 600, ".")
    e = s.expect(2)
    assert (e.world, e.kind, e.distributed_type, e.backend, e.devices, e.skip) == (2, "npu", "MULTI_NPU", "hccl",
                                                                                 ("npu:0", "npu:1"), "")
    short = session.Session(info(NPU1), None, "auto", 2, 600, ".").expect(2)
    assert (short.kind, short.distributed_type, short.backend) == ("cpu", "MULTI_CPU", "gloo")
    assert "需要 2 张 NPU，这台只看得见 1 张" in short.skip and "hccl/MULTI_NPU" in short.skip
    cpu_asked = session.Session(info(NPU2), None, "cpu", 2, 600, ".").expect(2)
    assert (cpu_asked.kind, cpu_asked.backend, cpu_asked.skip) == ("cpu", "gloo", "")
    one = session.Session(info(CUDA1), None, "auto", 1, 600, ".").expect(1)
    assert (one.distributed_type, one.backend, one.devices) == ("NO", None, ("cuda",))


STAND_IN = """world=2 distributed_type=MULTI_CPU backend=gloo mixed_precision=no
rank 0 of 2 on cpu
rank 1 of 2 on cpu
device=cpu final_loss=0.1
"""


def test_a_stand_in_where_the_cards_are_fails_saying_why():
    e = session.Session(info(NPU2), None, "auto", 2, 600, ".").expect(2)
    with pytest.raises(AssertionError, match="这台机器看得见 2 张 NPU.*distributed_type=MULTI_CPU（应为 MULTI_NPU）.*CPU 代跑"):
        e.assert_ran(STAND_IN)
    on_cards = STAND_IN.replace("MULTI_CPU", "MULTI_NPU").replace("gloo", "hccl").replace("on cpu", "on npu:X")
    with pytest.raises(AssertionError, match="各 rank 的设备"):
        e.assert_ran(on_cards.replace("device=cpu", "device=npu"))
    e.assert_ran(on_cards.replace("device=cpu", "device=npu").replace("0 of 2 on npu:X", "0 of 2 on npu:0")
                 .replace("1 of 2 on npu:X", "1 of 2 on npu:1"))
    stand_in = session.Session(info(NPU1), None, "auto", 2, 600, ".").expect(2)
    stand_in.assert_ran(STAND_IN.replace("on cpu", "on cpu:0"))  # the labelled stand-in; accelerate 1.15 says cpu:0


# A fault in the launch rule, loaded into every kernel by IPython's startup folder: the multi-process launches it
# names (FAULT: "all", or "bf16" for the bf16 launches only) go to the CPU stand-in although the cards are there.
FAULT = """
import dataclasses, os
from nbtools import decide, detect, magics

def launch_spec(call, *, info=None, **kw):
    if (call.num_processes or 0) > 1 and os.environ["FAULT"] in ("all", call.mixed_precision):
        info = dataclasses.replace(info or detect(), count=0)
    return decide.launch_spec(call, info=info, **kw)

magics.launch_spec = launch_spec
"""


@pytest.mark.notebook
def test_a_rule_that_sends_the_cards_launches_to_the_stand_in_fails_the_seed_checks(tmp_path):
    startup = tmp_path / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-fault.py").write_text(FAULT)
    statuses = {}
    for fault, notebooks in (("all", ["01_training", "02_distributed_eval"]), ("bf16", ["01_training"])):
        out = tmp_path / fault
        subprocess.run([sys.executable, "-m", "nbtools", "run", "--simulate-npu", *(f"{NOTEBOOKS}/{n}.ipynb" for n in notebooks),
                        "--output", str(out)], env={**os.environ, "IPYTHONDIR": str(tmp_path / "ipython"), "FAULT": fault},
                       capture_output=True, text=True, timeout=900)
        report = json.loads((out / "report.json").read_text())
        statuses[fault] = {c["id"]: (c["status"], c["reason"]) for c in report["checks"] if c["notebook"]}
    failed = [statuses["all"]["acc-launch"], statuses["bf16"]["acc-launch-bf16"], statuses["all"]["acc-gather-multi"]]
    for status, reason in failed:
        assert status == "failed" and "这台机器看得见 2 张 NPU" in reason and "CPU 代跑" in reason, (status, reason)
    assert statuses["bf16"]["acc-launch"][0] == "passed"  # the same check, its launch on the cards


# ---------------------------------------------------------------- the stand-in's ranks never see a card (accelerate 1.15)


def test_the_stand_ins_ranks_are_kept_off_the_cards(tmp_path):
    """accelerate 1.15 puts wait_for_everyone's barrier on the host's accelerator even on MULTI_CPU: the stand-in's
    ranks (fewer cards, or device='cpu' on a card host) get the cards hidden; the cards' own route is untouched."""
    cuda = decide.plan(info(dict(CUDA1)), 2)
    assert cuda.env["CUDA_VISIBLE_DEVICES"] == "" and "看不见 GPU" in cuda.why and cuda.files == ()
    for plan in (decide.plan(info(NPU1), 2), decide.plan(info(NPU2), 2, "cpu")):
        folder, files = plan.env["PYTHONPATH"].split(os.pathsep)[0], dict(plan.files)  # written by the launch
        assert "raise ImportError" in files[os.path.join(folder, "torch_npu", "__init__.py")]
        assert 'sys.modules["torch_npu"] = None' in files[os.path.join(folder, "sitecustomize.py")]
        assert plan.env["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "0" and "导入即失败" in plan.why
        assert plan.env["ACCELERATE_USE_CPU"] == "1"
    assert "PYTHONPATH" not in decide.plan(info(NPU2), 2).env and "PYTHONPATH" not in decide.plan(info(NPU1), 1).env
    assert decide.plan(info(NPU1), 2, fit=True).env == {"ASCEND_RT_VISIBLE_DEVICES": "0"}


@pytest.mark.notebook
def test_with_the_npu_hidden_a_rank_sees_no_accelerator(tmp_path):
    """On the simulated NPU, a rank started with the stand-in's variables finds no torch.npu and no accelerator."""
    from nbtools import simnpu_env
    env = {**os.environ, **simnpu_env.environment(cards=1)}
    route = decide.plan(info(NPU1), 2)
    guarded.write_files(route.files)  # as a launch writes them
    empty = route.env["PYTHONPATH"].split(os.pathsep)[0]  # in front of this environment's PYTHONPATH
    hidden = {"PYTHONPATH": os.pathsep.join([empty, env["PYTHONPATH"]]), "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    # transformers and PEFT ask find_spec and then import torch_npu (07b's ranks import a PEFT model): hidden, it is absent
    program = ("import torch, accelerate.utils as u; from deepspeed.accelerator import get_accelerator as g; "
               "from transformers.utils import is_torch_npu_available as t; import peft; "
               "print(torch._C._get_accelerator().type, hasattr(torch, 'npu'), u.is_npu_available(), g()._name, t())")
    seen = [subprocess.run([sys.executable, "-c", program], env={**env, **extra}, capture_output=True, text=True,
                           timeout=300).stdout.splitlines()[-1].split() for extra in ({}, hidden)]
    assert seen == [["npu", "True", "True", "npu", "True"], ["cpu", "False", "False", "cpu", "False"]], seen


def _floor_python() -> str | None:
    """An interpreter with accelerate below 1.16 and nbtools (CI's floor stack, .venv-py310), or NBTOOLS_FLOOR_PYTHON."""
    from conftest import ROOT
    python = os.environ.get("NBTOOLS_FLOOR_PYTHON") or os.path.join(ROOT, ".venv-py310", "bin", "python")
    if not os.access(python, os.X_OK):
        return None
    probe = subprocess.run([python, "-c", "import nbtools, accelerate; print(accelerate.__version__)"],
                           capture_output=True, text=True, timeout=120)
    return python if probe.returncode == 0 and probe.stdout.strip().startswith("1.15.") else None


@pytest.mark.notebook
def test_one_card_with_accelerate_1_15_runs_01b(tmp_path):
    """The measured failure (`No backend type associated with device type npu`), on the floor stack. README's
    ci:floor-py310 runs this very command into nbtools-output/floor-py310-one-card: its report is read when it is newer
    than what it ran (CI running that command before the tests); else the command runs here, where a floor stack is."""
    out = ci_output("floor-py310-one-card")
    if out is None:
        python = _floor_python()
        if python is None:
            pytest.skip("no floor stack (accelerate 1.15): set NBTOOLS_FLOOR_PYTHON or build .venv-py310 (README)")
        out = tmp_path / "out"
        proc = subprocess.run([python, "-m", "nbtools", "run", "--simulate-npu", "--npu-cards", "1",
                               f"{NOTEBOOKS}/01b_training_right.ipynb", "--output", str(out)],
                              capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert report["summary"]["ok"] and [n["status"] for n in report["notebooks"]] == ["passed"], report["notebooks"]
    assert (report["device"]["simulated"], report["device"]["count"]) == (True, 1), report["device"]
    assert report["device"]["versions"]["accelerate"].startswith("1.15.")
    assert {c["id"]: c["status"] for c in report["checks"] if c["notebook"]}["train-ddp-parity"] == "passed"
