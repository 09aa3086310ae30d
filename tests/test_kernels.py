"""The runner's kernels (nbtools/kernels.py) with real kernels: started ahead, warmed, handed to
papermill, connected by the runner's client, and shut down by the runner (used or not)."""

from __future__ import annotations

import json
import os
import signal
import time

import nbformat
import psutil
import pytest
from jupyter_core.utils import run_sync
from nbformat.v4 import new_code_cell, new_notebook

from nbtools.kernels import KERNEL_ENV, KernelsAhead


@pytest.fixture
def kernels(tmp_path):
    with KernelsAhead("python3", lambda p: tmp_path / f"{p.stem}.kernel.log", tmp_path / "k", {"NBTOOLS_TEST": "x y"}) as ahead:
        yield ahead


def _run(kc, code: str) -> str:
    """Run ``code`` in the kernel; its stdout."""
    out = []
    reply = run_sync(kc.execute_interactive)(code, output_hook=lambda m: out.append(m["content"].get("text", "")), timeout=60)
    assert reply["content"]["status"] == "ok", reply["content"]
    return "".join(out)


def _gone(pid: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_a_kernel_started_ahead_is_warm_clean_and_on_ipc(kernels, tmp_path):
    nb = tmp_path / "sub" / "01_x.ipynb"
    nb.parent.mkdir()
    kernels.ahead(nb)
    state = kernels.take(nb)
    km = state.km
    assert km.has_kernel and km.transport == "ipc" and os.path.dirname(km.connection_file) == str(tmp_path / "k")
    kc = km.client()
    assert type(kc).__name__ == "RunnerKernelClient"
    kc.start_channels()
    run_sync(kc.wait_for_ready)(timeout=60)
    seen = _run(kc, "import os, sys\nprint(os.getcwd(), 'matplotlib.pyplot' in sys.modules, 'matplotlib' in dir())")
    assert seen.split() == [str(nb.parent), "True", "False"]
    pid = state.pid
    kernels.close(state)  # also closes the channels of the clients the manager made
    assert _gone(pid) and not kc.channels_running


def test_a_kernel_the_runner_starts_is_unattended_and_told_its_notebook(kernels, tmp_path):
    """workdir's rules read what the runner hands a kernel: KERNEL_ENV makes it unattended (a private work folder,
    removed at the end), and it is told its notebook's path as JupyterLab tells it (workdir.notebook_stem)."""
    state = kernels.take(tmp_path / "03_big_model_inference.ipynb")
    kc = state.km.client()
    kc.start_channels()
    run_sync(kc.wait_for_ready)(timeout=60)
    seen = _run(kc, "import os\nfrom nbtools import workdir\n"
                    "print(workdir.notebook_stem(), workdir.unattended(dict(os.environ, CI='')))")
    assert seen.split() == ["03_big_model_inference", "True"]
    kernels.close(state)


def test_a_kernel_started_for_the_first_notebook_is_not_warmed(kernels, tmp_path):
    state = kernels.take(tmp_path / "00_first.ipynb")
    kc = state.km.client()
    kc.start_channels()
    run_sync(kc.wait_for_ready)(timeout=60)
    assert _run(kc, "import sys\nprint('matplotlib' in sys.modules)").strip() == "False"
    kernels.close(state)


def test_wait_for_ready_says_when_the_kernel_died(kernels, tmp_path):
    state = kernels.take(tmp_path / "00_first.ipynb")
    os.kill(state.pid, signal.SIGKILL)
    kc = state.km.client()
    kc.start_channels()
    with pytest.raises(RuntimeError, match="died"):
        run_sync(kc.wait_for_ready)(timeout=30)
    kernels.close(state)  # a dead kernel: only its files and sockets are cleaned up
    assert not state.km.has_kernel or not run_sync(state.km.is_alive)()


def test_papermill_runs_the_notebook_in_the_kernel_it_is_handed(kernels, tmp_path):
    """``execute_notebook(km=...)``: the notebook runs in the kernel started for it, with the runner's
    environment (given to the kernel, not set in this process), its output in the kernel log; nbclient
    leaves the kernel running, and `close` shuts it down."""
    import papermill as pm

    nb = new_notebook(cells=[new_code_cell(
        "import json, os\nos.write(1, b'kernel-own-stdout\\n')\n"
        f"print(json.dumps({{'pid': os.getpid(), 'env': {{k: os.environ.get(k) for k in {[*KERNEL_ENV, 'NBTOOLS_TEST']!r}}}}}))"
    )])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "00_nb.ipynb"
    nbformat.write(nb, path)
    state = kernels.take(path)
    pm.execute_notebook(str(path), str(tmp_path / "out.ipynb"), kernel_name="python3", km=state.km, progress_bar=False,
                        on_cell_execute=state.on_cell_execute, on_cell_executed=state.on_cell_executed)
    out = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    seen = json.loads(out.cells[0].outputs[0]["text"])
    assert seen == {"pid": state.pid, "env": {**KERNEL_ENV, "NBTOOLS_TEST": "x y"}}
    assert "NBTOOLS_TEST" not in os.environ and not state.busy
    assert run_sync(state.km.is_alive)(), "nbclient shut down a kernel it does not own"
    pid = state.pid
    kernels.close(state)
    assert _gone(pid)
    assert "kernel-own-stdout" in (tmp_path / "00_nb.kernel.log").read_text()


SENTINEL = """import signal, sys, time
signal.signal(signal.SIGINT, lambda *a: (open({seen!r}, 'w').write('SIGINT'), sys.exit()))
open({ready!r}, 'w').close()
time.sleep(30)"""


@pytest.mark.parametrize("busy", [False, True])
def test_closing_interrupts_only_a_busy_kernel(busy, kernels, tmp_path):
    """An idle kernel is asked to exit without a SIGINT (an ipykernel interrupted in a message handler
    logs "KeyboardInterrupt caught in kernel"); a busy kernel (a timed-out cell) is interrupted before it
    is killed. The signals jupyter_client sends go through the provisioner's ``send_signal``, recorded
    here; a child in the kernel's process group records any SIGINT that reaches it in time to write."""
    seen, ready = tmp_path / "sigint-seen", tmp_path / "ready"
    state = kernels.take(tmp_path / "00_x.ipynb")
    kc = state.km.client()
    kc.start_channels()
    run_sync(kc.wait_for_ready)(timeout=60)
    code = SENTINEL.format(seen=str(seen), ready=str(ready))
    _run(kc, f"import subprocess, sys\nchild = subprocess.Popen([sys.executable, '-c', {code!r}])")
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    child = next(p for p in psutil.Process(state.pid).children() if "sys.exit" in " ".join(p.cmdline()))
    sent = []
    provisioner = state.km.provisioner
    send_signal = provisioner.send_signal

    async def recording(signum):
        sent.append(signum)
        await send_signal(signum)

    provisioner.send_signal = recording
    state.busy = busy
    kernels.close(state)
    assert _gone(child.pid), "the kernel's child outlived it"
    if busy:
        assert sent[:1] == [signal.SIGINT], sent
    else:
        assert signal.SIGINT not in sent and not seen.exists(), "an idle kernel got SIGINT"


def test_kernels_never_used_are_shut_down(tmp_path):
    with KernelsAhead("python3", lambda p: tmp_path / f"{p.stem}.kernel.log", tmp_path / "k") as kernels:
        kernels.ahead(tmp_path / "01_a.ipynb")
        kernels.ahead(tmp_path / "02_b.ipynb")
        pids = [state.pid for state in kernels._started.values()]
        assert len(pids) == 2 and all(psutil.pid_exists(p) for p in pids)
    assert all(_gone(pid, timeout=1) for pid in pids)
