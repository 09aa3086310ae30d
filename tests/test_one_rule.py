"""One place per rule: each rule below is changed in its one home, and every user is seen to follow."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nbtools import decide, device, doctor, npusmi, proctree, session, simnpu_env
from nbtools.checks import Here
from nbtools.errors import LaunchTimeout, ParameterError
from nbtools.guarded import run_command

IGNORES_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"


def test_the_stop_grace_has_one_home(monkeypatch):
    """proctree.GRACE (SIGTERM, then SIGKILL that much later) is what the guardian of a launch waits: a command that
    ignores SIGTERM and runs past its timeout is killed GRACE after it, with GRACE changed in proctree alone."""
    monkeypatch.setattr(proctree, "GRACE", 0.5)
    start = time.monotonic()
    with pytest.raises(LaunchTimeout, match="up"):
        run_command([sys.executable, "-c", IGNORES_TERM], timeout=1.5, echo=False)
    took = time.monotonic() - start
    assert took < 1.5 + 3.5, f"stopped after {took:.1f} s: the guardian did not take proctree.GRACE (0.5 s)"


# A probe's answers for a host with two NPUs (DeviceInfo is built from them as from the real probe's).
NPU2 = {"python": "3.11.7", "torch": "2.14.1", "torch_npu": "2.9.0.post2", "npu_available": True, "npu_count": 2,
        "npu_names": ["Ascend910B4"] * 2, "npu_bf16": True}


def rewrite(monkeypatch, home, rule):
    """Change a rule that is a function in its one home: its code is replaced in place, so every module that holds
    the function (``from .decide import cpu_stands_in``) runs the changed rule."""
    monkeypatch.setattr(home, "__code__", rule.__code__)


def test_fewer_cards_than_ranks_has_one_home(monkeypatch):
    """decide.cpu_stands_in decides when ranks run on the CPU for want of cards: the route, Session.expect and a check's
    needs (cards=N, cpu) follow it when it changes there (here: one card more than ranks is needed)."""
    info = device.from_probe(NPU2, environ={})
    assert not decide.plan(info, 2).fallback and Here("npu", 2).meets("cards=2")  # the rule as it is
    rewrite(monkeypatch, decide.cpu_stands_in, lambda kind, cards, ranks: kind != "cpu" and cards <= ranks)
    assert decide.plan(info, 2).fallback and decide.plan(info, 2).kind == "cpu", "decide.plan did not follow decide.cpu_stands_in"
    assert decide.plan(info, 3, fit=True).num_processes == 2, "the fitted route did not follow decide.cpu_stands_in"
    assert session.Session(info, None, "auto", 2, 600, ".").expect(2).kind == "cpu", "Session.expect did not follow"
    assert not Here("npu", 2).meets("cards=2") and Here("npu", 2, processes=2).meets("cpu"), "checks did not follow"


def test_bf16_on_the_cpu_has_one_home(monkeypatch):
    """decide.precisions_on says which precisions a launch on a kind takes (the CPU: bf16, no fp16): DeviceInfo's list,
    its precision check and a check's needs:bf16 follow it when it changes there (here: a CPU without bf16)."""
    cpu = device.from_probe({"python": "3.11.7", "torch": "2.14.1"}, environ={})
    assert "bf16" in cpu.mixed_precisions and Here("cpu").meets("bf16")  # the rule as it is
    rewrite(monkeypatch, decide.precisions_on, lambda kind, bf16: ("no",) if kind == "cpu" else MIXED_PRECISIONS)
    assert cpu.mixed_precisions == ("no",), "DeviceInfo.mixed_precisions did not follow decide.precisions_on"
    with pytest.raises(ParameterError, match="bf16"):
        decide.check_precision(cpu, "bf16", "cpu")
    assert not Here("cpu").meets("bf16"), "a check's needs:bf16 did not follow decide.precisions_on"


MIXED_PRECISIONS = decide.MIXED_PRECISIONS  # the rewritten rule's code reads its globals from decide


def test_the_visible_card_variables_have_one_home(monkeypatch):
    """device.VISIBLE_VARS names the variable that lists a kind's cards: the probe's reading, the plan's env, npu-smi's
    count without torch and the CUDA host's hidden cards follow it when it changes there."""
    monkeypatch.setitem(device.VISIBLE_VARS, "npu", "ONE_RULE_NPUS")
    monkeypatch.setitem(device.VISIBLE_VARS, "cuda", "ONE_RULE_GPUS")
    info = device.from_probe(NPU2, environ={"ONE_RULE_NPUS": "1", "ASCEND_RT_VISIBLE_DEVICES": "0"})
    assert (info.visible_var, info.visible_devices) == ("ONE_RULE_NPUS", "1"), "from_probe did not follow VISIBLE_VARS"
    assert decide.plan(info, 1).env == {"ONE_RULE_NPUS": "1"}, "decide.plan did not follow VISIBLE_VARS"
    assert npusmi.cards_seen("npu", environ={"ONE_RULE_NPUS": "0,1,2", "PATH": ""}, dev="/nonexistent") == 3
    assert decide.hide_cards("cuda")[0] == {"ONE_RULE_GPUS": ""}, "hide_cards did not follow VISIBLE_VARS"


def test_the_cache_root_has_one_home(monkeypatch, tmp_path):
    """device.cache_root is nbtools' cache folder: the probe's cached answers and the hidden-cards shim a launch writes
    (decide.hide_cards names it) go there when it changes there."""
    monkeypatch.setenv("ONE_RULE_CACHE", str(tmp_path))
    rewrite(monkeypatch, device.cache_root, lambda: Path(os.environ["ONE_RULE_CACHE"]))
    files = decide.hide_cards("npu")[2]
    assert str(tmp_path / "hide-npu" / "sitecustomize.py") in dict(files), "hide_cards did not follow device.cache_root"
    device.cached_probe(refresh=True)
    assert list(tmp_path.glob("probe-*.json")), "cached_probe did not follow device.cache_root"


def simnpu_copy(tmp_path: Path, edit: tuple[str, str, str] | None = None) -> Path:
    """simnpu/ with its site copied (``edit``: (file under simnpu/, old, new) made in the copy) and the rest linked."""
    root = tmp_path / "simnpu"
    root.mkdir()
    for name in os.listdir(simnpu_env.SIMNPU_ROOT):
        (root / name).symlink_to(simnpu_env.SIMNPU_ROOT / name)
    if edit:
        part = edit[0].split("/")[0]
        (root / part).unlink()
        shutil.copytree(simnpu_env.SIMNPU_ROOT / part, root / part)
        text = (root / edit[0]).read_text()
        assert edit[1] in text, edit
        (root / edit[0]).write_text(text.replace(edit[1], edit[2]))
    return root


def test_the_simulated_hosts_card_maximum_has_one_home(monkeypatch, tmp_path):
    """simnpu.h's kMaxCards: nbtools' --npu-cards check reads it, and the C++ part is compiled from it (its cache key
    hashes the header): with the header changed to 3, --npu-cards 4 is refused and the built part takes SIMNPU_CARDS
    up to 3 (4, over its maximum, falls back to the default 2)."""
    most = int((simnpu_env.SIMNPU_ROOT / "csrc" / "simnpu.h").read_text().split("kMaxCards = ", 1)[1].split(";")[0])
    assert simnpu_env.environment(cards=most, environ={})["SIMNPU_CARDS"] == str(most)
    with pytest.raises(ParameterError, match=f"from 1 to {most}"):
        simnpu_env.environment(cards=most + 1, environ={})
    root = simnpu_copy(tmp_path, ("csrc/simnpu.h", f"kMaxCards = {most};", "kMaxCards = 3;"))
    monkeypatch.setattr(simnpu_env, "SIMNPU_ROOT", root)
    with pytest.raises(ParameterError, match="from 1 to 3"):
        simnpu_env.environment(cards=4, environ={})
    env = sim_env(tmp_path, cards=3)
    code = "import torch; print('CARDS', torch.npu.device_count())"
    for cards, seen in ((3, 3), (4, 2)):
        out = subprocess.run([sys.executable, "-c", code], env={**env, "SIMNPU_CARDS": str(cards)}, capture_output=True,
                             text=True, timeout=300)
        assert f"CARDS {seen}" in out.stdout, out.stdout + out.stderr


def sim_env(tmp_path: Path, **kw) -> dict[str, str]:
    """This environment with simnpu_env's variables (of its SIMNPU_ROOT), a state and a build cache of the test's own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SIMNPU_", "ASCEND_"))}
    return {**env, **simnpu_env.environment(environ=env, **kw), "SIMNPU_STATE_DIR": str(tmp_path / "state"),
            "SIMNPU_CACHE_DIR": str(tmp_path / "cache")}


def test_which_soc_has_no_bf16_has_one_home(monkeypatch, tmp_path):
    """simnpu's SoC table (_simnpu/_runtime.py SOCS) says which card has no bf16; nbtools never names a card for it:
    the probe's answer, DeviceInfo's precisions and doctor's devices row follow a table changed there (here: a 910B4
    without bf16), and the C++ part, configured from it at import, refuses a bf16 tensor."""
    root = simnpu_copy(tmp_path, ("site/_simnpu/_runtime.py", '"Ascend910B4": (32 * 2**30, True)', '"Ascend910B4": (32 * 2**30, False)'))
    monkeypatch.setattr(simnpu_env, "SIMNPU_ROOT", root)
    env = {**sim_env(tmp_path, cards=2, soc="Ascend910B4"), "SIMNPU_CACHE_DIR": os.environ.get("SIMNPU_CACHE_DIR", "")}
    info = device.from_probe(device.run_probe(env=env), environ=env)
    assert info.kind == "npu" and not info.bf16, f"the probe did not follow simnpu's SOCS: {info.raw}"
    row = doctor._devices_row(info)
    assert "bf16" not in info.mixed_precisions and row.status == doctor.WARN and "310P" not in row.note, row
    code = "import torch\ntry:\n    torch.zeros(1, dtype=torch.bfloat16, device='npu')\nexcept RuntimeError as e:\n    print('NO', e)"
    made = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert "NO" in made.stdout and "no bfloat16" in made.stdout, made.stdout + made.stderr


def test_whether_a_card_has_bf16_is_its_own_answer():
    """The probe's npu_bf16 (torch.npu.is_bf16_supported()) is the one answer to "has this card bf16": DeviceInfo and
    doctor's devices row follow it whatever the card is called (a 910B4 that answers False is warned of, in words
    that name no card; a 310P3 that answers True is not)."""
    for names, bf16 in ((["Ascend910B4"] * 2, False), (["Ascend310P3"] * 2, True)):
        info = device.from_probe(dict(NPU2, npu_names=names, npu_bf16=bf16), environ={})
        row = doctor._devices_row(info)
        assert ("bf16" in info.mixed_precisions) is bf16 and (row.status == doctor.WARN) is not bf16, row
        assert "310P" not in row.note and ("is_bf16_supported() is False" in row.note) is not bf16, row
