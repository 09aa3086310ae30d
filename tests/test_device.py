"""Device detection. The NPU and CUDA branches are tested by substituting ONLY the probe's
answers (what torch / torch_npu would report on such a host); the plan logic is real."""

import os
import re

import pytest

from nbtools import DeviceError, ParameterError, decide, detect, validate
from nbtools.device import from_probe

NPU2 = {
    "python": "3.12.3",
    "torch": "2.9.0+cpu",
    "torch_npu": "2.9.0.post2",
    "cann": "9.1.0",
    "npu_available": True,
    "npu_count": 2,
    "npu_names": ["Ascend910B4", "Ascend910B4"],
    "cuda_available": False,
    "cuda_count": 0,
    "cuda_names": [],
}
CUDA1 = {"python": "3.11.7", "torch": "2.13.0", "cuda_available": True, "cuda_count": 1, "cuda_names": ["H200"], "cuda_bf16": True}
CPU = {"python": "3.11.7", "torch": "2.13.0+cpu", "cuda_available": False, "cuda_count": 0}
NO_CANN = {
    "python": "3.11.7",
    "torch_error": "RuntimeError: Failed to load the backend extension: torch_npu. You can disable extension "
    "auto-loading with TORCH_DEVICE_BACKEND_AUTOLOAD=0.",
}


# Asked of torch directly, in a child process, without nbtools: what this machine really has.
_INDEPENDENT = r"""
import json, torch
out = {"cuda": torch.cuda.device_count() if torch.cuda.is_available() else 0, "npu": 0}
try:
    import torch_npu  # noqa: F401
    out["npu"] = torch.npu.device_count() if torch.npu.is_available() else 0
except ImportError:
    pass
print(json.dumps(out))
"""


def test_this_machine_is_detected_and_its_plan_follows():
    """Whatever the host (CPU only, one CUDA GPU, two NPUs): detect() agrees with torch asked
    directly, and the 2-process plan is the real group this host can start."""
    import json
    import subprocess
    import sys

    from nbtools.device import BACKENDS, DISTRIBUTED_TYPES, VISIBLE_VARS

    truth = json.loads(subprocess.run([sys.executable, "-c", _INDEPENDENT], capture_output=True, text=True,
                                      timeout=300, check=True).stdout.strip().splitlines()[-1])
    kind = "npu" if truth["npu"] else "cuda" if truth["cuda"] else "cpu"
    info = detect()
    assert (info.kind, info.count) == (kind, truth.get(kind, 0))
    assert info.backend == BACKENDS[kind]
    assert info.versions["torch"] and info.versions["accelerate"]
    plan = decide.plan(info, 2)
    assert plan.num_processes == 2 and plan.flags[plan.flags.index("--num_processes") + 1] == "2"
    if info.count >= 2:  # a real hccl/nccl group on the first two devices
        assert plan.kind == kind and not plan.fallback
        visible = [v.strip() for v in os.environ.get(VISIBLE_VARS[kind], "").split(",") if v.strip()] or ["0", "1"]
        assert plan.env == {VISIBLE_VARS[kind]: ",".join(visible[:2])} and plan.cards == tuple(visible[:2])
    else:  # CPU only, or one accelerator: the gloo route, labelled a stand-in when it replaces one
        assert plan.kind == "cpu" and plan.env == {"ACCELERATE_USE_CPU": "1"} and "--multi_gpu" in plan.flags
        assert plan.fallback == (kind != "cpu")
    assert (plan.backend, plan.distributed_type) == (BACKENDS[plan.kind], DISTRIBUTED_TYPES[plan.kind])


def test_probe_substituted_two_npus_plan_uses_hccl_and_visible_devices():
    info = from_probe(NPU2, environ={})
    assert (info.kind, info.count, info.backend) == ("npu", 2, "hccl")
    assert info.versions["cann"] == "9.1.0"
    plan = decide.plan(info, 2)
    assert plan.env == {"ASCEND_RT_VISIBLE_DEVICES": "0,1"}
    # as the quick-start writes it: on NPU, --num_processes 2 switches multi-NPU on by itself
    assert "--multi_gpu" not in plan.flags and plan.flags[:2] == ("--num_processes", "2")
    assert plan.cards == ("0", "1")
    assert (plan.backend, plan.distributed_type, plan.fallback) == ("hccl", "MULTI_NPU", False)


def test_probe_substituted_npu_respects_already_restricted_visible_devices():
    info = from_probe(dict(NPU2, npu_count=3), environ={"ASCEND_RT_VISIBLE_DEVICES": "4,5,7"})
    assert decide.plan(info, 2).env == {"ASCEND_RT_VISIBLE_DEVICES": "4,5"}


def test_probe_substituted_one_cuda_two_processes_falls_back_to_cpu_labelled():
    info = from_probe(CUDA1, environ={})
    plan = decide.plan(info, 2)
    assert plan.fallback and plan.kind == "cpu" and plan.backend == "gloo"
    assert "CPU（gloo）代跑" in plan.note and "没有用到 hccl/nccl" in plan.note
    assert plan.env == {"CUDA_VISIBLE_DEVICES": "", "ACCELERATE_USE_CPU": "1"}  # the ranks never see the GPU
    single = decide.plan(info, 1)
    assert single.kind == "cuda" and single.env == {"CUDA_VISIBLE_DEVICES": "0"} and not single.fallback
    assert (single.backend, single.distributed_type) == (None, "NO")  # one process: no group


def test_probe_substituted_310p_has_no_bf16():
    """torch_npu's own answer (the probe's npu_bf16) decides, never the card's name (simnpu's SOCS is the one home)."""
    info = from_probe(dict(NPU2, npu_names=["Ascend310P3", "Ascend310P3"], npu_bf16=False), environ={})
    assert "bf16" not in info.mixed_precisions
    with pytest.raises(ParameterError, match="mixed_precision='bf16'.*accepted here: no, fp16"):
        validate(device="auto", num_processes=2, mixed_precision="bf16", info=info)


def test_probe_substituted_torch_npu_without_cann_is_reported_with_its_fix():
    info = from_probe(NO_CANN, environ={})
    assert not info.healthy and info.kind == "cpu"
    (problem,) = info.problems
    assert "torch_npu" in problem.what and "set_env.sh" in problem.fix
    with pytest.raises(DeviceError, match="set_env.sh"):
        validate(info=info)


def test_asking_for_a_device_that_is_not_here_says_what_to_do():
    info = from_probe(CPU, environ={})
    with pytest.raises(DeviceError, match="device='npu' asked.*Use device='auto' or 'cpu'"):
        decide.plan(info, 2, "npu")
    assert decide.plan(from_probe(NPU2, environ={}), 2, "cpu").kind == "cpu"


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"num_processes": 0}, r"num_processes=0 is invalid; accepted: an integer >= 1"),
        ({"num_processes": "2"}, r"num_processes='2' is invalid"),
        ({"device": "tpu"}, r"device='tpu' is not known; accepted: 'auto', 'npu', 'cuda', 'cpu'"),
        ({"mixed_precision": "fp8"}, r"mixed_precision='fp8' is not known; accepted: no, fp16, bf16"),
        ({"mixed_precision": "fp16"}, r"mixed_precision='fp16' is not supported on cpu.*accepted here: no, bf16"),
        ({"timeout_s": 0}, r"timeout_s=0 is invalid"),
    ],
)
def test_bad_parameters_name_the_parameter_and_accepted_values(kwargs, pattern):
    with pytest.raises(ParameterError, match=pattern):
        validate(info=from_probe(CPU, environ={}), **kwargs)


def test_unwritable_work_dir_is_a_parameter_error(tmp_path):
    import nbtools

    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ParameterError, match="work_dir=.*cannot be written"):
        nbtools.work_dir(str(blocker / "sub"))


def test_doctor_holds_python_and_torch_to_the_floors_stated_once():
    """The floors are nbtools/floors.py's; pyproject's requires-python (pip's refusal) says the same Python."""
    from importlib import metadata

    import tomllib

    from nbtools import doctor, floors

    with open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "pyproject.toml"), "rb") as f:
        declared = tomllib.load(f)["project"]["requires-python"]
    assert declared == metadata.metadata("accelerate-ascend-nbtools")["Requires-Python"] == f">={floors.PYTHON}"
    rows = {r.what: r for r in doctor.diagnose(from_probe(dict(CPU, python="3.9.18")))}
    assert rows["python"].status == doctor.FAIL and floors.PYTHON in rows["python"].note, rows["python"]
    assert rows["setup"].status == doctor.FAIL and rows["setup"].note == floors.USE_INSTEAD, rows["setup"]
    rows = {r.what: r for r in doctor.diagnose(from_probe(dict(CPU, python="3.10.13", torch="2.8.0")))}
    assert rows["torch"].status == doctor.FAIL and floors.TORCH in rows["torch"].note, rows["torch"]
    assert "torch 2.8.0 (the series needs 2.9.0 or later)" in rows["setup"].found, rows["setup"]
    rows = {r.what: r for r in doctor.diagnose(from_probe(dict(CPU, python="3.10.13", torch=floors.TORCH + "+cpu")))}
    assert (rows["python"].status, rows["torch"].status) == (doctor.INFO, doctor.OK) and "setup" not in rows, rows


def test_a_setup_below_the_floors_stops_with_what_to_use_instead():
    """Every notebook's setup cell: torch 2.5.1 (an old ModelArts image) is a blocking problem naming the image."""
    from nbtools import floors

    info = from_probe(dict(CPU, torch="2.5.1"))
    with pytest.raises(DeviceError, match=re.escape(floors.IMAGE)):
        validate(device="auto", num_processes=2, timeout_s=60, info=info)


@pytest.mark.parametrize("layout", ["cann", "ascend-toolkit"])
def test_cann_set_env_is_found_in_either_layout_and_through_the_install_record(tmp_path, layout):
    from nbtools.device import cann_set_env

    root = tmp_path / "Ascend"
    (root / layout).mkdir(parents=True)
    (root / layout / "set_env.sh").write_text("export ASCEND_HOME_PATH=x\n")
    assert cann_set_env(tmp_path / "no-record", root=str(root)) == str(root / layout / "set_env.sh")
    record = tmp_path / "ascend_cann_install.info"
    record.write_text(f"Install_Path={root}\n")
    assert cann_set_env(record, root=str(tmp_path / "elsewhere")) == str(root / layout / "set_env.sh")
    assert cann_set_env(tmp_path / "no-record", root=str(tmp_path / "elsewhere")) is None


def test_doctor_holds_packages_to_requirements_txt(monkeypatch, tmp_path):
    """The specifiers come from requirements.txt (packaging), not from a copy in the doctor."""
    import nbtools
    from nbtools import doctor

    req = tmp_path / "requirements.txt"
    req.write_text("# comment\naccelerate>=1.0\ntransformers>=4.40,<5.0  # the quick-start's\n-r other.txt\n")
    (tmp_path / "other.txt").write_text("peft>=0.13\n")  # as requirements.txt reads requirements-learner.txt
    monkeypatch.setattr(doctor, "REQUIREMENTS", req)
    assert {k: str(v) for k, v in doctor.series_requirements().items()} == {
        "accelerate": ">=1.0", "transformers": "<5.0,>=4.40", "peft": ">=0.13"}
    real = doctor.installed
    monkeypatch.setattr(doctor, "installed", lambda pkg: "4.30.0" if pkg == "transformers" else real(pkg))
    rows = {r.what: r for r in doctor.diagnose(nbtools.detect())}
    assert rows["transformers"].status == doctor.WARN and "transformers<5.0,>=4.40" in rows["transformers"].note
    assert rows["accelerate"].status == doctor.OK
    req.write_text("transformers>=4.50,<6\n")  # the range requirements.txt declares: 5.x is in it, nothing to say
    monkeypatch.setattr(doctor, "installed", lambda pkg: "5.24.0" if pkg == "transformers" else real(pkg))
    assert {r.what: r for r in doctor.diagnose(nbtools.detect())}["transformers"].status == doctor.OK
