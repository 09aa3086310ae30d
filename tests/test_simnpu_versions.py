"""simnpu: what each real torch_npu release the stand-in presents (SIMNPU_TORCH_NPU: 2.9.0.post2, 2.14.0) does
differently, read from the real wheels' sources: the task queue in an interactive interpreter, the allocator's
variables, the names. Real processes, no mocks."""

from __future__ import annotations

import os
import sys

import pytest
from test_simnpu import SIMNPU, py, run, sim_env

VERSIONS = ("2.9.0.post2", "2.14.0")
WARNING = {  # the real strings (2.9.0.post2 torch_npu/__init__.py, 2.14.0 torch_npu/_init/core/optional_features.py)
    "2.9.0.post2": "On the interactive interface, the value of TASK_QUEUE_ENABLE is set to 0 by default. "
                   "                     Do not set it to 1 to prevent some unknown errors",
    "2.14.0": "On the interactive interface, the value of TASK_QUEUE_ENABLE is set to 0 by default. "
              "Do not set it to 1 to avoid unexpected errors.",
}


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("simnpu-versions")
    r = py("import torch, torch_npu; print(torch_npu.__version__)", sim_env(d), d)
    assert r.returncode == 0, r.stdout
    return d


@pytest.mark.parametrize("version", VERSIONS)
def test_task_queue_is_set_to_0_in_an_interactive_interpreter_only(work, version):
    """Both releases: `import torch` (autoload) in an interactive interpreter (`python -i`, IPython, Jupyter)
    overwrites TASK_QUEUE_ENABLE with "0", whatever the user set, and warns; a script keeps the user's value."""
    probe = work / "tq.py"
    probe.write_text("import os, torch\nprint('TQ', os.environ.get('TASK_QUEUE_ENABLE'), torch.npu.device_count())\n")
    env = sim_env(work, SIMNPU_TORCH_NPU=version, TASK_QUEUE_ENABLE="2", PYTHONWARNINGS="default")
    inter = run([sys.executable, "-i", str(probe)], env, work)
    assert "TQ 0 2" in inter.stdout and WARNING[version] in inter.stdout, inter.stdout
    other = WARNING[VERSIONS[1 - VERSIONS.index(version)]]
    assert other not in inter.stdout, inter.stdout
    ipy = py("import builtins; builtins.__IPYTHON__ = True\nimport os, torch\n"
             "print('TQ', os.environ.get('TASK_QUEUE_ENABLE'))", env, work)
    assert "TQ 0" in ipy.stdout and WARNING[version] in ipy.stdout, ipy.stdout
    script = run([sys.executable, str(probe)], env, work)
    assert "TQ 2 2" in script.stdout and "TASK_QUEUE_ENABLE is set" not in script.stdout, script.stdout
    unset = run([sys.executable, str(probe)], {k: v for k, v in env.items() if k != "TASK_QUEUE_ENABLE"}, work)
    assert "TQ None 2" in unset.stdout, unset.stdout


def test_version_and_autoload_switch_per_release(work):
    """torch_npu.__version__ names the release; `import torch_npu` before torch leaves the autoload switch at 0
    in 2.9.0.post2 and restores it in 2.14.0 (which calls _autoload() at the end of its import)."""
    code = "import os, torch_npu; print('V', torch_npu.__version__, os.environ['TORCH_DEVICE_BACKEND_AUTOLOAD'])"
    assert "V 2.9.0.post2+simulated 0" in py(code, sim_env(work), work).stdout
    assert "V 2.14.0+simulated 1" in py(code, sim_env(work, SIMNPU_TORCH_NPU="2.14.0"), work).stdout
    bad = py("import torch_npu", sim_env(work, SIMNPU_TORCH_NPU="2.10.0"), work)
    assert bad.returncode != 0 and "SIMNPU_TORCH_NPU='2.10.0'" in bad.stdout, bad.stdout
    assert os.path.isdir(SIMNPU)


SNAPSHOT = """
import torch
x = torch.empty(40 << 20, dtype=torch.uint8, device="npu")
y = torch.empty(1000, device="npu")
segs = torch.npu.memory_snapshot()
print("SEGS", sorted((s["segment_type"], s["total_size"] >> 20, s["is_expandable"]) for s in segs),
      torch.npu.memory_reserved() >> 20, sum(s["allocated_size"] for s in segs) == torch.npu.memory_allocated())
"""


@pytest.mark.parametrize("version", VERSIONS)
def test_the_allocator_reports_expandable_segments_only_when_set(work, version):
    """memory_snapshot() gives the real segment dicts; with expandable_segments:True the large pool's one segment
    grows by 20 MiB pages and says is_expandable, as the real allocator reports it; without, a 40 MiB request
    reserves 40 MiB (rounded to 2 MiB) in a segment that is not expandable."""
    env = sim_env(work, SIMNPU_TORCH_NPU=version)
    plain = py(SNAPSHOT, env, work)
    assert "SEGS [('large', 42, False)] 42 True" in plain.stdout, plain.stdout
    on = py(SNAPSHOT, {**env, "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True"}, work)
    assert "SEGS [('large', 60, True)] 60 True" in on.stdout, on.stdout
    # PYTORCH_ALLOC_CONF: read by 2.14.0 only
    other = py(SNAPSHOT, {**env, "PYTORCH_ALLOC_CONF": "expandable_segments:True"}, work)
    assert ("SEGS [('large', 60, True)]" if version == "2.14.0" else "SEGS [('large', 42, False)]") in other.stdout


def test_both_allocator_variables_are_refused_by_2_14_0_with_its_own_words(work):
    both = {"PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True", "PYTORCH_ALLOC_CONF": "expandable_segments:True"}
    r = py(SNAPSHOT, sim_env(work, SIMNPU_TORCH_NPU="2.14.0", **both), work)
    assert r.returncode != 0 and ("RuntimeError: Both PYTORCH_NPU_ALLOC_CONF and PYTORCH_ALLOC_CONF have been set, "
                                  "please set only one of them.") in r.stdout, r.stdout
    old = py(SNAPSHOT, sim_env(work, **both), work)   # 2.9.0.post2 reads only PYTORCH_NPU_ALLOC_CONF
    assert "SEGS [('large', 60, True)]" in old.stdout, old.stdout


def test_2_14_0_names_task_queue_and_config(work):
    """set_task_queue_enable / get_task_queue_enable exist in 2.14.0 only; torch.npu.config in both (setting
    allow_internal_format is accepted, as on a card)."""
    code = """
import torch
torch.npu.config.allow_internal_format = False
print("HAS", hasattr(torch.npu, "set_task_queue_enable"))
if hasattr(torch.npu, "set_task_queue_enable"):
    print("TQ", torch.npu.get_task_queue_enable())
    torch.npu.set_task_queue_enable("2")
    print("TQ", torch.npu.get_task_queue_enable())
    try:
        torch.npu.set_task_queue_enable(3)
    except RuntimeError as e:
        print("REFUSED", e)
"""
    assert "HAS False" in py(code, sim_env(work), work).stdout
    r = py(code, sim_env(work, SIMNPU_TORCH_NPU="2.14.0", TASK_QUEUE_ENABLE="1"), work)
    assert "HAS True\nTQ 1\nTQ 2\nREFUSED mode must be 0, 1, or 2, but got 3." in r.stdout, r.stdout


def test_nbtools_torch_npu_option_presents_the_release(work):
    """`--torch-npu 2.14.0` puts site-2.14.0's dist-info in front: the probe, pip and the stand-in say 2.14.0; without
    --simulate-npu the option is refused by name."""
    env = {k: v for k, v in sim_env(work).items() if k not in ("PYTHONPATH", "SIMNPU_TORCH_NPU")}
    env["PYTHONPATH"] = os.path.dirname(SIMNPU)
    r = run([sys.executable, "-m", "nbtools", "detect", "--simulate-npu", "--torch-npu", "2.14.0"], env, work)
    assert r.returncode == 0 and "torch_npu 2.14.0+simulated" in r.stdout, r.stdout
    r = run([sys.executable, "-m", "nbtools", "detect", "--torch-npu", "2.14.0"], env, work)
    assert r.returncode != 0 and "--torch-npu describe the simulated NPU: add --simulate-npu" in r.stdout, r.stdout
