"""The runner's kernels (nbtools/kernels.py) with real kernels: started ahead, adopted, warmed,
connected by the runner's client, and shut down when never used."""

from __future__ import annotations

import os
import signal

import psutil
import pytest
from jupyter_core.utils import run_sync

from nbtools.kernels import KernelsAhead, adopting


@pytest.fixture
def kernels(tmp_path):
    ahead = KernelsAhead("python3", lambda p: tmp_path / f"{p.stem}.kernel.log", tmp_path / "k")
    yield ahead
    ahead.discard()


def _run(kc, code: str) -> str:
    """Run ``code`` in the kernel; its stdout."""
    out = []
    reply = run_sync(kc.execute_interactive)(code, output_hook=lambda m: out.append(m["content"].get("text", "")), timeout=60)
    assert reply["content"]["status"] == "ok", reply["content"]
    return "".join(out)


def test_a_kernel_started_ahead_is_adopted_warm_and_clean(kernels, tmp_path):
    nb = tmp_path / "sub" / "01_x.ipynb"
    nb.parent.mkdir()
    kernels.ahead(nb)
    state, cls = kernels.take(nb)
    km = cls(kernel_name="python3")  # what nbclient does with the class it is given
    assert km is state.km and km.has_kernel
    kc = km.client()
    assert type(kc).__name__ == "RunnerKernelClient"
    kc.start_channels()
    try:
        run_sync(kc.wait_for_ready)(timeout=60)
        seen = _run(kc, "import os, sys\nprint(os.getcwd(), 'matplotlib.pyplot' in sys.modules, 'matplotlib' in dir())")
        assert seen.split() == [str(nb.parent), "True", "False"]
    finally:
        kc.stop_channels()
        run_sync(km.shutdown_kernel)(now=True)


def test_a_kernel_started_for_the_first_notebook_is_not_warmed(kernels, tmp_path):
    state, cls = kernels.take(tmp_path / "00_first.ipynb")
    kc = state.km.client()
    kc.start_channels()
    try:
        run_sync(kc.wait_for_ready)(timeout=60)
        assert _run(kc, "import sys\nprint('matplotlib' in sys.modules)").strip() == "False"
    finally:
        kc.stop_channels()
        run_sync(state.km.shutdown_kernel)(now=True)


def test_wait_for_ready_says_when_the_kernel_died(kernels, tmp_path):
    state, _ = kernels.take(tmp_path / "00_first.ipynb")
    os.kill(state.pid, signal.SIGKILL)
    kc = state.km.client()
    kc.start_channels()
    try:
        with pytest.raises(RuntimeError, match="died"):
            run_sync(kc.wait_for_ready)(timeout=30)
    finally:
        kc.stop_channels()
        run_sync(state.km.shutdown_kernel)(now=True)


def test_kernels_never_used_are_shut_down(kernels, tmp_path):
    kernels.ahead(tmp_path / "01_a.ipynb")
    kernels.ahead(tmp_path / "02_b.ipynb")
    pids = [km.provisioner.process.pid for _, km in kernels._started.values()]
    assert len(pids) == 2 and all(psutil.pid_exists(p) for p in pids)
    kernels.discard()
    for pid in pids:
        try:
            assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            pass


def test_adopting_hands_over_the_started_manager_without_reinitialising_it():
    class Manager:
        def __init__(self):
            self.inits = getattr(self, "inits", 0) + 1

    started = Manager()
    assert adopting(started)(kernel_name="x", config=None) is started and started.inits == 1
