"""The runner's kernels: a fresh one per notebook, started one notebook ahead.

A kernel takes about 0.6 s to start (its interpreter, ipykernel, the first handshake), and a
notebook that draws spends about 0.4 s more importing matplotlib. The runner starts notebook
N+1's kernel when notebook N starts, so that it boots while N runs, and a kernel started ahead
imports ``matplotlib.pyplot`` as it boots (``IPKernelApp.exec_lines``; no name is bound in the
notebook's namespace); papermill then adopts it instead of starting its own. Nothing of the
notebook runs before its first cell: the kernel started in the notebook's folder, with the
runner's environment. A kernel started ahead that is never used (the run stopped) is shut down
with the run.

The client connecting to a kernel is jupyter_client's, except that once the kernel answered, it
does not wait for 0.2 s of silence on IOPub (jupyter_client's "flush"): nbclient takes from IOPub
only the messages that answer the cell it runs.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import time
from pathlib import Path
from queue import Empty

from .errors import NbtoolsError

# What every kernel the runner starts gets in its environment: the notebooks' work-folder rule
# reads NBTOOLS_UNATTENDED (a private temporary folder, removed at the end); the other two make
# the kernel and every Python it starts write and read UTF-8 whatever the locale (LANG=C, GBK).
KERNEL_ENV = {"NBTOOLS_UNATTENDED": "1", "PYTHONIOENCODING": "utf-8", "PYTHONUTF8": "1"}
# nbclient's own rule for the kernels it starts: no IPython history database written.
IPYKERNEL_ARGS = ["--HistoryManager.hist_file=:memory:"]
# A kernel started ahead imports the plotting library while the notebook before it runs. A block,
# not an expression, so that nothing is displayed; nothing is bound in the user's namespace.
WARM_UP = 'try:\n    __import__("matplotlib.pyplot")\nexcept Exception:\n    pass'


class RunStopped(NbtoolsError):
    """A stop signal (Ctrl-C, SIGTERM, SIGHUP) arrived: the notebook starts no further cell."""


class KernelState:
    """One notebook's kernel, as the runner sees it: its manager, and whether a cell is running."""

    def __init__(self):
        self.km = None
        self.busy = False
        self.stopping = False

    def on_cell_execute(self, **_):
        if self.stopping:  # a stop signal arrived between two cells: start no further cell
            raise RunStopped("the run was stopped: no further cell starts")
        self.busy = True

    def on_cell_executed(self, **_):
        self.busy = False

    @property
    def pid(self) -> int | None:
        proc = getattr(getattr(self.km, "provisioner", None), "process", None)
        return getattr(proc, "pid", None)


_connection_numbers = itertools.count()  # unique in this process: a kernel ahead runs beside the current one


def kernel_manager_class(state: KernelState, log_path: Path, conn_dir: Path | None):
    """A KernelManager class for one notebook (papermill takes a class, not an instance).

    - IPC transport (unix sockets in the run's private temp dir) instead of TCP on localhost:
      nothing listens on a port, and ipykernel does not warn "running over TCP without encryption";
    - the kernel process' own stdout/stderr (ipykernel's log) go to ``log_path``, not the terminal;
    - KERNEL_ENV in the kernel's environment;
    - shutting down an idle kernel does not interrupt it first (jupyter_client sends SIGINT before
      every shutdown; an idle ipykernel logs "KeyboardInterrupt caught in kernel" when it lands in a
      message handler); a busy kernel (a timed-out cell) is still interrupted.
    """
    from jupyter_client.manager import AsyncKernelManager

    class RunnerKernelManager(AsyncKernelManager):
        def __init__(self, **kw):
            if conn_dir is not None:
                conn_dir.mkdir(parents=True, exist_ok=True)
                kw.setdefault("transport", "ipc")
                kw.setdefault("connection_file", str(conn_dir / f"{next(_connection_numbers)}.json"))
            super().__init__(**kw)
            self.client_factory = runner_kernel_client()  # what `client()` builds

        async def _async_launch_kernel(self, kernel_cmd, **kw):
            kw["env"] = {**(kw.get("env") or os.environ), **KERNEL_ENV}
            with open(log_path, "ab") as log:
                kw["stdout"], kw["stderr"] = log, subprocess.STDOUT
                await super()._async_launch_kernel(kernel_cmd, **kw)
            state.km = self

        async def _async_interrupt_kernel(self):
            if self.shutting_down and not state.busy:
                return  # an idle kernel has nothing to interrupt
            await super()._async_interrupt_kernel()

    return RunnerKernelManager


def runner_kernel_client() -> type:
    """jupyter_client's AsyncKernelClient whose ``wait_for_ready`` returns once the kernel answered
    ``kernel_info`` on shell and IOPub (jupyter_client then also waits for 0.2 s of silence)."""
    from jupyter_client.asynchronous import AsyncKernelClient

    class RunnerKernelClient(AsyncKernelClient):
        async def wait_for_ready(self, timeout: float | None = None) -> None:
            deadline = time.monotonic() + (float("inf") if timeout is None else timeout)
            while True:
                self.kernel_info()
                try:
                    msg = await self.shell_channel.get_msg(timeout=1)
                except Empty:
                    msg = None
                if msg is not None and msg["msg_type"] == "kernel_info_reply":
                    try:  # IOPub is connected once the request's own status message arrives
                        await self.iopub_channel.get_msg(timeout=0.2)
                    except Empty:
                        pass
                    else:
                        self._handle_kernel_info_reply(msg)
                        break
                if not await self._async_is_alive():
                    raise RuntimeError("Kernel died before replying to kernel_info")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"Kernel didn't respond in {timeout:.0f} seconds")
            while True:  # drop what is queued now (the request's other status message); wait for nothing
                try:
                    await self.iopub_channel.get_msg(timeout=0.01)
                except Empty:
                    break

    return RunnerKernelClient


def ipc_dir(run_root: Path) -> Path | None:
    d = run_root / "k"
    # a unix socket path holds at most 107 bytes: '<dir>/<n>-ipc-<port>'
    return d if len(os.fsencode(str(d))) <= 90 else None


def adopting(km) -> type:
    """A class for papermill's ``kernel_manager_class`` whose "instance" is ``km``, already started.

    nbclient instantiates the class it is given; ``__new__`` returns the started manager, which is
    not an instance of this subclass, so Python skips ``__init__`` and nbclient finds a manager that
    has a kernel: it connects, runs the notebook and shuts the kernel down, as with its own.
    """

    class Adopted(type(km)):
        def __new__(cls, *args, **kwargs):
            return km

    return Adopted


class KernelsAhead:
    """Each notebook's kernel, started when the notebook before it starts."""

    def __init__(self, kernel: str, log_for, conn_dir: Path | None):
        self.kernel = kernel
        self.log_for = log_for  # notebook path -> the file its kernel's own output goes to
        self.conn_dir = conn_dir
        self._started: dict[Path, tuple[KernelState, object]] = {}

    def start(self, path: Path, warm: bool = False) -> None:
        """Start ``path``'s kernel now, in the notebook's folder, unless it is started already;
        ``warm``: an ipykernel also imports matplotlib as it boots."""
        if path in self._started:
            return
        from jupyter_core.utils import run_sync

        state = KernelState()
        log_path = self.log_for(path)
        log_path.write_bytes(b"")
        km = kernel_manager_class(state, log_path, self.conn_dir)(kernel_name=self.kernel)
        args = [*IPYKERNEL_ARGS, f"--IPKernelApp.exec_lines={WARM_UP}"] if warm else IPYKERNEL_ARGS
        run_sync(km.start_kernel)(cwd=str(path.parent), extra_arguments=args if km.ipykernel else [])
        self._started[path] = (state, km)

    def ahead(self, path: Path) -> None:
        """Start ``path``'s kernel while another notebook runs; a failure is left for ``take`` to report."""
        try:
            self.start(path, warm=True)
        except Exception:
            pass

    def take(self, path: Path) -> tuple[KernelState, type]:
        """``path``'s kernel (started now if it was not): its state, and the class papermill is given."""
        self.start(path)
        state, km = self._started.pop(path)
        return state, adopting(km)

    def discard(self) -> None:
        """Shut down the kernels started ahead that no notebook used (the run stopped early)."""
        from jupyter_core.utils import run_sync

        while self._started:
            _, (_, km) = self._started.popitem()
            try:
                run_sync(km.shutdown_kernel)(now=True)
            except Exception:  # already gone: nothing to stop
                pass
