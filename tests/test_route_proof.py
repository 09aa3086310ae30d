"""The card count decides (issues 48 and 50): the learner's own job shrinks to the visible cards (``--fit``), and
the launch checks' expectations come from the probe, never from the plan that chose the route."""

from __future__ import annotations

import pytest

from nbtools import commands, launcher, session
from nbtools.device import from_probe
from nbtools.launcher import LaunchOptions

CPU = {"python": "3.12.1", "torch": "2.9.0"}
NPU2 = {"python": "3.12.1", "torch": "2.9.0", "torch_npu": "2.9.0.post2", "cann": "9.1.0", "npu_available": True,
        "npu_count": 2, "npu_names": ["Ascend910B4"] * 2}
NPU1 = dict(NPU2, npu_count=1, npu_names=["Ascend910B4"])
CUDA1 = {"python": "3.12.1", "torch": "2.9.0", "cuda_available": True, "cuda_count": 1, "cuda_names": ["H200"]}


def info(probe):
    return from_probe(probe, environ={})


def sess(probe, device="auto", n=2, tmp_path="."):
    i = info(probe)
    return session.Session(i, i.plan(n, device), device, n, 600, tmp_path)


def spec(text, probe, tmp_path):
    call = commands.parse_launch(text)
    return launcher.launch_spec(call, info=info(probe), cwd=tmp_path, fit=call.written.fit)


def test_the_learners_job_shrinks_to_the_visible_cards_and_says_so(tmp_path):
    fitted = spec("--fit accelerate launch --num_processes 2 --mixed_precision bf16 t.py", NPU1, tmp_path)
    assert (fitted.plan.kind, fitted.plan.num_processes, fitted.plan.devices) == ("npu", 1, ["npu:0"])
    assert "学员自己的任务：要 2 个进程，只看得见 1 张 NPU：用 1 个进程，在 npu:0 上" in fitted.why
    shown = fitted.shown(None)
    assert "--num_processes 1" in shown and "ACCELERATE_USE_CPU" not in shown and "ASCEND_RT_VISIBLE_DEVICES=0 " in shown
    cuda = spec("--fit accelerate launch --num_processes 4 t.py", CUDA1, tmp_path)
    assert cuda.plan.devices == ["cuda:0"] and "只看得见 1 张 CUDA：用 1 个进程，在 cuda:0 上" in cuda.why
    # without --fit the seed's rule holds: N ranks on the labelled CPU stand-in
    seed = spec("accelerate launch --num_processes 2 t.py", NPU1, tmp_path)
    assert seed.plan.fallback and "ACCELERATE_USE_CPU=1" in seed.shown(None)


@pytest.mark.parametrize("probe, device", [(CPU, "auto"), (NPU2, "auto"), (NPU1, "cpu")])
def test_fit_changes_nothing_on_a_cpu_or_with_enough_cards(tmp_path, probe, device):
    call = commands.parse_launch("accelerate launch --num_processes 2 t.py")
    plain = launcher.launch_spec(call, info=info(probe), device=device, cwd=tmp_path)
    fitted = launcher.launch_spec(call, info=info(probe), device=device, cwd=tmp_path, fit=True)
    assert (fitted.plan, fitted.why, fitted.shown(1)) == (plain.plan, plain.why, plain.shown(1))
    assert sess(probe, device).fitted(2) == 2


def test_fitted_counts_from_the_probe_and_fit_is_a_launch_option(monkeypatch, tmp_path):
    assert [sess(p).fitted(n) for p, n in ((NPU1, 2), (NPU1, 1), (NPU2, 8), (CUDA1, 2))] == [1, 1, 2, 1]
    with pytest.raises(Exception, match="--fit are %launch options"):
        from nbtools.magics import run_written
        run_written("--fit python --version")
    seen = []
    monkeypatch.setattr(launcher, "launch", lambda s, **kw: seen.append(s))
    launcher.accelerate_launch("t.py", options=LaunchOptions(fit=True, info=info(NPU1), cwd=tmp_path))
    assert seen[0].plan.num_processes == 1 and seen[0].plan.kind == "npu"
