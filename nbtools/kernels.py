"""The runner's kernels, and a kernel spec that loads CANN.

A fresh kernel per notebook, started one notebook ahead: notebook N+1's kernel boots (about 0.6 s,
plus 0.4 s importing ``matplotlib.pyplot`` through ``IPKernelApp.exec_lines``, binding no name) while
notebook N runs, in N+1's folder, with the runner's environment plus KERNEL_ENV and the run's own
variables. Papermill gets the started manager (``execute_notebook(km=...)``); nbclient shuts down only
the managers it made, so ``KernelsAhead.close`` shuts each notebook's kernel down (idle: request_shutdown,
finish_shutdown, cleanup_resources, which log no "KeyboardInterrupt caught in kernel"; busy:
``shutdown_kernel(now=True)``) and ``KernelsAhead`` shuts down at its end the kernels no notebook used.
All of it is jupyter_client's public API. ``RunnerKernelClient`` does not wait for jupyter_client's
0.2 s of IOPub silence once the kernel answered: nbclient takes from IOPub only what answers its cell.

The kernel spec: on ModelArts or a JupyterHub no shell of yours runs before JupyterLab, so ``source
set_env.sh`` cannot reach the kernels, but a kernel spec's ``env`` can. ``sourced_env`` and ``env_diff``
find what a ``set_env.sh`` really changes (a list it only extended keeps ``${PATH}``, which
jupyter_client >= 7 fills from the server's environment); ``kernel_json`` / ``from_set_env`` build the
spec; ``install`` has the kernel's own interpreter install it with ipykernel
(``ipykernel.kernelspec.install(env=...)``), into the user's Jupyter data dir or
``<prefix>/share/jupyter/kernels/<name>/``. In a terminal: ``python -m nbtools.kernels --name cann``
(this machine's set_env.sh, see device.cann_set_env) or ``python -m nbtools.kernels SCRIPT --name cann``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from queue import Empty

from jupyter_client import AsyncKernelClient, AsyncKernelManager, protocol_version_info
from jupyter_core.utils import run_sync

from .errors import NbtoolsError
from .lang import SESSION_ENV
from .workdir import UNATTENDED_ENV

# What every kernel the runner starts gets in its environment: the notebooks' work-folder rule
# reads UNATTENDED_ENV (a private temporary folder, removed at the end); the other two make
# the kernel and every Python it starts write and read UTF-8 whatever the locale (LANG=C, GBK).
KERNEL_ENV = {UNATTENDED_ENV: "1", "PYTHONIOENCODING": "utf-8", "PYTHONUTF8": "1"}
# nbclient's own rule for the kernels it starts: no IPython history database written.
IPYKERNEL_ARGS = ["--HistoryManager.hist_file=:memory:"]
# A kernel started ahead imports the plotting library while the notebook before it runs. A block,
# not an expression, so that nothing is displayed; nothing is bound in the user's namespace.
WARM_UP = 'try:\n    __import__("matplotlib.pyplot")\nexcept Exception:\n    pass'
SHUTDOWN_POLL_S = 0.02  # how often finish_shutdown looks whether the kernel has exited (jupyter_client: 0.1)


class RunStopped(NbtoolsError):
    """A stop signal (Ctrl-C, SIGTERM, SIGHUP) arrived: the notebook starts no further cell."""


class KernelState:
    """One notebook's kernel, as the runner sees it: its manager, and whether a cell is running."""

    def __init__(self, km=None):
        self.km = km
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


class RunnerKernelManager(AsyncKernelManager):
    """jupyter_client's AsyncKernelManager that keeps the clients it made (nbclient's, through ``client()``), so that
    their channels are closed with the kernel: nbclient leaves them open when it was handed the manager."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.clients: list = []

    def client(self, **kw):
        kc = super().client(**kw)
        self.clients.append(kc)
        return kc


class RunnerKernelClient(AsyncKernelClient):
    """jupyter_client's AsyncKernelClient whose ``wait_for_ready`` returns once the kernel answered ``kernel_info`` on
    shell and IOPub (jupyter_client then also waits for 0.2 s of silence)."""

    async def wait_for_ready(self, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (float("inf") if timeout is None else timeout)
        while (reply := await _kernel_info(self)) is None:
            if not await self.is_alive():
                raise RuntimeError("Kernel died before replying to kernel_info")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Kernel didn't respond in {timeout:.0f} seconds")
        self.adapt_protocol(reply)
        # drop what is queued now (the request's other status message); wait for nothing
        while await _next(self.iopub_channel, 0.01) is not None:
            pass

    def adapt_protocol(self, reply: dict) -> None:
        """Speak the kernel's major protocol version, as jupyter_client does on kernel_info_reply."""
        major = int(reply["content"].get("protocol_version", "5").split(".")[0])
        if major != protocol_version_info[0]:
            self.session.adapt_version = major


async def _next(channel, timeout: float) -> dict | None:
    """The next message on ``channel`` within ``timeout`` s, else None."""
    try:
        return await channel.get_msg(timeout=timeout)
    except Empty:
        return None


async def _kernel_info(kc) -> dict | None:
    """Ask for kernel_info once: the reply, when it came on shell within 1 s and IOPub is connected
    (the request's own status message arrived within 0.2 s); else None."""
    kc.kernel_info()
    msg = await _next(kc.shell_channel, 1)
    if msg is None or msg["msg_type"] != "kernel_info_reply":
        return None
    return msg if await _next(kc.iopub_channel, 0.2) is not None else None


async def shutdown(km, busy: bool) -> None:
    """Shut ``km``'s kernel down and close the channels of the clients it made.

    An idle kernel is asked to exit (a shutdown request, no signal: about 0.2 s; ipykernel ends
    the children in its process group itself, SIGTERM then SIGKILL). jupyter_client sends its
    process group SIGTERM after half of ``shutdown_wait_time`` (5 s) and SIGKILL at its end: an
    ipykernel that keeps a child it never reaped waits for that SIGTERM. A ``busy`` kernel is
    interrupted, then killed. A kernel that is gone already only has its files and sockets
    cleaned up.
    """
    for kc in getattr(km, "clients", ()):
        kc.stop_channels()
    if not await km.is_alive():
        await km.cleanup_resources()
    elif busy:
        await km.shutdown_kernel(now=True)  # interrupt, kill, clean up
    else:
        await km.request_shutdown()
        await km.finish_shutdown(pollinterval=SHUTDOWN_POLL_S)
        await km.cleanup_resources()


class KernelsAhead:
    """Each notebook's kernel, started when the notebook before it starts.

    ``env``: variables every kernel gets besides KERNEL_ENV, on top of this process' environment
    (the kernel spec's own ``env`` is applied over both). As a context manager, it shuts down at
    its end the kernels started ahead that no notebook used.
    """

    def __init__(self, kernel: str, log_for, conn_dir: Path, env: dict | None = None):
        self.kernel = kernel
        self.log_for = log_for  # notebook path -> the file its kernel's own output goes to
        self.conn_dir = conn_dir
        self.env = {**KERNEL_ENV, **(env or {})}
        self._started: dict[Path, KernelState] = {}

    def __enter__(self) -> KernelsAhead:
        return self

    def __exit__(self, *exc) -> None:
        self.discard()

    def _manager(self):
        kw = {"kernel_name": self.kernel, "client_factory": RunnerKernelClient}
        # IPC (nothing listens on a port, and no "running over TCP" warning) where the folder leaves room for the
        # socket's name: a unix socket path holds at most 107 bytes, '<conn_dir>/<n>-ipc-<port>'
        if len(os.fsencode(str(self.conn_dir))) <= 90:
            self.conn_dir.mkdir(parents=True, exist_ok=True)
            kw.update(transport="ipc", connection_file=str(self.conn_dir / f"{next(_connection_numbers)}.json"))
        return RunnerKernelManager(**kw)

    def start(self, path: Path, warm: bool = False) -> None:
        """Start ``path``'s kernel now, in the notebook's folder and told its path as JupyterLab 4 tells it
        (JPY_SESSION_NAME: nbtools.lang reads the notebook's language from it), unless it is started already;
        ``warm``: an ipykernel also imports matplotlib as it boots. The kernel's own stdout and
        stderr (ipykernel's log) go to ``log_for(path)``, not the terminal."""
        if path in self._started:
            return
        km = self._manager()
        args = [*IPYKERNEL_ARGS, f"--IPKernelApp.exec_lines={WARM_UP}"] if warm else IPYKERNEL_ARGS
        with open(self.log_for(path), "wb") as log:  # the kernel process keeps its own copy of the file
            run_sync(km.start_kernel)(cwd=str(path.parent), env={**os.environ, **self.env, SESSION_ENV: str(path)},
                                      stdout=log, stderr=subprocess.STDOUT, extra_arguments=args if km.ipykernel else [])
        self._started[path] = KernelState(km)

    def ahead(self, path: Path) -> None:
        """Start ``path``'s kernel while another notebook runs; a failure is left for ``take`` to report."""
        with contextlib.suppress(Exception):
            self.start(path, warm=True)

    def take(self, path: Path) -> KernelState:
        """``path``'s kernel, started now if it was not; ``.km`` is the manager papermill is handed."""
        self.start(path)
        return self._started.pop(path)

    @contextmanager
    def running(self, path: Path):
        """``path``'s kernel (`take`) for the block, shut down (`close`) at its end."""
        state = self.take(path)
        try:
            yield state
        finally:
            self.close(state)

    def close(self, state: KernelState) -> None:
        """Shut down the kernel a notebook ran in (`shutdown`); a cell still running, or a stop
        signal, makes it an interrupt and a kill."""
        run_sync(shutdown)(state.km, busy=state.busy or state.stopping)

    def discard(self) -> None:
        """Shut down the kernels started ahead that no notebook used (the run stopped early)."""
        while self._started:
            _, state = self._started.popitem()
            with contextlib.suppress(Exception):  # already gone: nothing to stop
                self.close(state)


# Variables bash itself changes between two `env` dumps; never part of what a script sets.
IGNORED = frozenset({"_", "SHLVL", "PWD", "OLDPWD", "BASH_EXECUTION_STRING"})
_SPLIT = "--nbtools-env-split--"


def _parse_env0(blob: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in blob.split("\0") if "=" in item)


def sourced_env(script: str | Path, base: dict | None = None, timeout: float = 60) -> tuple[dict, dict]:
    """(before, after): the environment of one bash before and after ``source script`` (its output kept apart)."""
    script = Path(script)
    if not script.is_file():
        raise FileNotFoundError(f"no such set_env script: {script}")
    prog = f'env -0; printf "\\0{_SPLIT}\\0"; source "$1" 1>&2; rc=$?; env -0; exit $rc'
    proc = subprocess.run(["bash", "-c", prog, "nbtools-kernelspec", str(script)], capture_output=True, text=True,
                          env=base, timeout=timeout)
    if proc.returncode != 0 or _SPLIT not in proc.stdout:
        raise RuntimeError(f"`source {script}` failed in bash (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    before, after = proc.stdout.split(f"\0{_SPLIT}\0", 1)
    return _parse_env0(before), _parse_env0(after)


def _template_escape(text: str) -> str:
    return text.replace("$", "$$")  # kernel spec env values are string.Template strings


def env_diff(before: dict, after: dict, template: bool = True) -> dict[str, str]:
    """The variables ``after`` sets or changes, as kernel spec ``env`` values.

    ``template=True``: a variable that was set before and was only extended keeps a ``${NAME}`` reference to
    its earlier value (jupyter_client >= 7 substitutes it at kernel start). ``template=False``: full values.
    A list variable that was unset before loses the empty entries ``X:$UNSET`` leaves (an empty entry in PATH
    or LD_LIBRARY_PATH means the current directory). Variables the script unsets cannot be expressed; they
    are left out.
    """
    out = {}
    for name, new in sorted(after.items()):
        if name in IGNORED or before.get(name) == new:
            continue
        old = before.get(name)
        if old is None and name.endswith("PATH") and ":" in new:
            new = ":".join(p for p in new.split(":") if p)
        if not template:
            out[name] = new
        elif old and new.endswith(":" + old):
            out[name] = _template_escape(new[: -len(old)]) + "${" + name + "}"
        elif old and new.startswith(old + ":"):
            out[name] = "${" + name + "}" + _template_escape(new[len(old):])
        else:
            out[name] = _template_escape(new)
    return out


def kernel_json(env: dict, python: str | None = None, display_name: str = "Python (CANN)") -> dict:
    """A kernel.json dict: the given interpreter's ipykernel, started with ``env``. `install` writes it
    through that interpreter's ipykernel, which adds its own interpreter flags and metadata."""
    return {
        "argv": [python or sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": display_name,
        "language": "python",
        "env": dict(env),
        "metadata": {"debugger": True},
    }


def from_set_env(script: str | Path, python: str | None = None, display_name: str = "Python (CANN)",
                 template: bool = True, base: dict | None = None) -> dict:
    """kernel.json for ``python`` with the environment ``source script`` produces."""
    before, after = sourced_env(script, base=base)
    return kernel_json(env_diff(before, after, template=template), python=python, display_name=display_name)


# Run by the kernel's interpreter: its own ipykernel writes the spec (the same call in ipykernel 6.29 and 7).
_INSTALL = "import json, sys\nfrom ipykernel.kernelspec import install\nprint(install(**json.load(sys.stdin)))"


def install(spec: dict, name: str, prefix: str | Path | None = None, timeout: float = 120) -> Path:
    """Install kernel ``name``: ``spec``'s interpreter (argv[0]) runs ``ipykernel.kernelspec.install`` with
    ``spec``'s display name and env, into ``<prefix>/share/jupyter/kernels/<name>/``, or without a prefix
    the user's Jupyter data dir; returns the path of the kernel.json written."""
    python = spec["argv"][0]
    args = {"kernel_name": name, "display_name": spec["display_name"], "env": dict(spec.get("env") or {}),
            "user": prefix is None, "prefix": None if prefix is None else str(prefix)}
    try:
        proc = subprocess.run([python, "-c", _INSTALL], input=json.dumps(args), capture_output=True, text=True,
                              timeout=timeout)
    except OSError as exc:
        raise RuntimeError(f"cannot run {python} to install the kernel spec: {exc}") from None
    if proc.returncode != 0 or not proc.stdout.strip():
        raise RuntimeError(f"{python}: ipykernel could not install the kernel spec (exit {proc.returncode}): "
                           f"{(proc.stderr or proc.stdout).strip()[-500:]}")
    return Path(proc.stdout.strip().splitlines()[-1]) / "kernel.json"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m nbtools.kernels", description=__doc__.splitlines()[0])
    p.add_argument("set_env", nargs="?", help="the set_env.sh to source (default: this machine's, found as "
                   "device.cann_set_env finds it: /usr/local/Ascend/cann/set_env.sh or .../ascend-toolkit/set_env.sh)")
    p.add_argument("--name", default="cann", help="kernel name (folder name), default: cann")
    p.add_argument("--display-name", default="Python (CANN)")
    p.add_argument("--python", default=sys.executable, help="interpreter the kernel runs (default: this one)")
    p.add_argument("--prefix", help="install under PREFIX/share/jupyter/kernels (default: the user's Jupyter data dir)")
    p.add_argument("--full-values", action="store_true", help="no ${VAR} references (jupyter_client < 7)")
    p.add_argument("--print", action="store_true", help="print the kernel.json ipykernel would write, install nothing")
    args = p.parse_args(argv)
    if args.set_env is None:
        from .device import CANN_INSTALL_INFO, cann_set_env

        args.set_env = cann_set_env()
        if args.set_env is None:
            p.error(f"no CANN set_env.sh found (neither in {CANN_INSTALL_INFO} nor under /usr/local/Ascend): name it")
    spec = from_set_env(args.set_env, python=args.python, display_name=args.display_name,
                        template=not args.full_values)
    if args.print:  # the kernel.json `install` would write: installed into a temporary prefix, read back
        with tempfile.TemporaryDirectory(prefix="nbtools-kernelspec-") as tmp:
            print(json.dumps(json.loads(install(spec, "preview", prefix=tmp).read_text()), indent=1))
        return 0
    path = install(spec, args.name, args.prefix)
    print(f"wrote {path}: restart nothing, pick '{args.display_name}' in Kernel > Change Kernel")
    return 0


if __name__ == "__main__":
    sys.exit(main())
