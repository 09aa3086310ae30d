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
