"""Run a command under the guardian (guardian.py): its output streamed into the cell and kept, its whole
process tree stopped on timeout, failure, Ctrl-C (JupyterLab's stop button) and kernel restart.

``run_command`` runs one and waits; ``start_background`` starts one and returns a ``Background`` handle.
Both print the command a learner would type (``Shown``), set PYTHONUNBUFFERED=1 and UTF-8 output, keep
Hugging Face offline, and give the command a private TMPDIR.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import weakref
from dataclasses import dataclass, replace
from pathlib import Path

from . import proctree
from .commands import shell_line
from .diagnose import CommandResult, benign_blocks, raise_on_failure, timeout_message, unglue_warning
from .errors import LaunchError, LaunchTimeout
from .plan import LaunchPlan

GUARDIAN = str(Path(__file__).with_name("guardian.py"))  # the parent of every command started here
MARKER_ENV = "NBTOOLS_LAUNCH"  # "<launch id>:<starter pid>" on every process of a launch (`nbtools ps`)
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Shown:
    """What a cell prints about a command; nothing else depends on it.

    ``command`` replaces the printed command line; ``as_written`` is the command as the learner typed it (the
    quick-start's form): printed first, and when it differs from what really runs, the real command follows
    with ``why``. ``timeout_name`` is the parameter a timeout message tells the learner to raise.
    """

    echo: bool = True
    command: str | None = None
    as_written: str | None = None
    why: str = ""
    timeout_name: str = "timeout"
    also: tuple[tuple[str, str], ...] = ()  # variables set beyond the printed ones (filled in by run_command)

    def announce(self, real: str) -> str:
        """The lines printed before ``real`` runs: as written, then as it runs here, why, what else is set."""
        if not self.as_written or self.as_written.strip() == real.strip():
            text = f"$ {real}\n"
        else:
            text = f"$ {self.as_written}\n# runs here as: {real}\n" + (f"# why: {self.why}\n" if self.why else "")
        if self.also:
            text += "# also set: " + shell_line([], dict(self.also)).strip() + "\n"
        return text


def as_shown(echo: bool | Shown) -> Shown:
    return echo if isinstance(echo, Shown) else Shown(echo=bool(echo))


def environment_and_shown(argv: list[str], env: dict[str, str | None] | None, offline: bool,
                          echo: bool | Shown) -> tuple[dict, Shown]:
    """The command's whole environment and what the cell shows. ``env`` is added to this process'
    environment (a None value removes that variable) and shown in the printed command; the ``# also set:``
    line names what is set beyond it (the offline and UTF-8 switches, unbuffered output)."""
    base = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONIOENCODING="utf-8", PYTHONUTF8="1")
    full_env = {k: v for k, v in {**base, **(OFFLINE_ENV if offline else {}), **(env or {})}.items() if v is not None}
    given = {k: v for k, v in (env or {}).items() if v is not None}
    shown = as_shown(echo)
    also = tuple((k, v) for k, v in full_env.items() if k not in given and os.environ.get(k) != v)
    # A private TMPDIR, removed afterwards: torch elastic and torch leave torchelastic_* and
    # torchinductor_* folders in the temp dir at every launch otherwise.
    full_env["TMPDIR"] = tempfile.mkdtemp(prefix="nbtools-tmp-")
    return full_env, replace(shown, command=shown.command or shell_line(argv, given), also=also)


def run_command(
    argv: list[str],
    *,
    env: dict[str, str | None] | None = None,
    cwd: str | os.PathLike | None = None,
    timeout: float | None = None,
    check: bool = True,
    offline: bool = True,
    echo: bool | Shown = True,
) -> CommandResult:
    """Run ``argv`` streaming its output; stop its whole process tree on any way out.

    ``env``: see ``environment_and_shown``. ``echo``: print the command and stream its output (True), nothing (False),
    or a ``Shown``. A non-zero exit, an error marker (diagnose.ERROR_MARKERS) or the timeout raises,
    unless ``check`` is False (the timeout always raises). The CommandResult is built here only (a launch adds its plan and
    port to it).
    """
    full_env, shown = environment_and_shown(argv, env, offline, echo)
    try:
        return _stream(argv, full_env, cwd, timeout, check, shown)
    finally:
        shutil.rmtree(full_env["TMPDIR"], ignore_errors=True)


class _Output:
    """The guardian's output, read by a thread as it comes: kept, and echoed to ``out`` if given."""

    def __init__(self, proc: subprocess.Popen, out):
        self.proc, self.out = proc, out
        self.lines: list[str] = []
        self.eof = False
        self._q: queue.Queue = queue.Queue()
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, b""):
            self._q.put(raw.decode("utf-8", errors="replace"))
        self._q.put(None)

    def _take(self, item: str | None, echo: bool = True) -> None:
        if item is None:
            self.eof = True
            return
        item = unglue_warning(item)
        self.lines.append(item)
        if echo and self.out is not None:
            self.out.write(item)
            self.out.flush()

    def read(self) -> None:
        """Take the next line, waiting up to 0.1 s (after end-of-file: until the guardian exits, at most 0.1 s)."""
        if self.eof:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=0.1)
            return
        with contextlib.suppress(queue.Empty):
            self._take(self._q.get(timeout=0.1))

    def drain(self, echo: bool = True) -> None:
        with contextlib.suppress(queue.Empty):
            while True:
                self._take(self._q.get_nowait(), echo)

    def close(self) -> None:
        self._reader.join(timeout=5)
        if not self._reader.is_alive() and self.proc.stdout:  # else something still holds the pipe
            self.proc.stdout.close()

    @property
    def text(self) -> str:
        return "".join(self.lines)


def _stream(argv, full_env, cwd, timeout, check, shown: Shown) -> CommandResult:
    """Start ``argv`` under a guardian (guardian.py), pump its output, stop its tree on any way out."""
    out = sys.stdout
    if shown.echo:
        print(shown.announce(shown.command), end="", flush=True)
    start = time.monotonic()
    proc = _guarded(argv, full_env, cwd, stdout=subprocess.PIPE)
    output = _Output(proc, out if shown.echo else None)
    deadline = None if timeout is None else start + timeout
    try:
        while not output.eof or proc.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                _stop_at_timeout(proc, output, argv, start, timeout, shown)
            output.read()
    except KeyboardInterrupt:
        n = len(_halt(proc).get("killed") or [])
        print(f"\n[nbtools] interrupted: stopped `{shown.command[:80]}` and every process it started"
              f"{f' ({n} had to be killed)' if n else ''}; none is left running.", file=out, flush=True)
        raise
    finally:
        if proc.poll() is None:  # any other way out of the loop (an exception while printing, ...)
            _halt(proc)
        output.close()
    output.drain()
    status = _status(proc)
    if status.get("returncode") is None:
        raise LaunchError(f"the launch guardian failed: {status.get('reason')}\n  $ {shown.command}")
    _, notes = benign_blocks(output.text, status["returncode"])
    result = CommandResult(shown.command, list(argv), status["returncode"], output.text, time.monotonic() - start,
                           killed=status.get("killed") or [], as_written=shown.as_written, notes=notes)
    if shown.echo and notes:
        print("".join(note + "\n" for note in notes), end="", file=out, flush=True)
    if check:  # the one place that decides whether a failure raises (a launch decides only whether to rerun)
        raise_on_failure(result)
    return result


def _stop_at_timeout(proc, output: _Output, argv, start, timeout, shown: Shown) -> None:
    """The launch ran past ``timeout``: stop its tree and raise LaunchTimeout with what it printed."""
    output.drain()
    before = output.text  # what it printed before we stopped it
    status = _halt(proc)
    output.close()
    output.drain(echo=False)
    result = CommandResult(shown.command, list(argv), -9, output.text, time.monotonic() - start,
                           killed=status.get("killed") or [], as_written=shown.as_written)
    raise LaunchTimeout(timeout_message(result, before, timeout, shown.timeout_name), result)


def _guarded(argv, full_env, cwd, stdout) -> subprocess.Popen:
    """Start ``argv`` under a guardian (guardian.py) in a new session; its stdin is our control line."""
    if os.path.dirname(argv[0]):  # a path: relative to cwd, as Popen (and the guardian) resolve it
        exe = os.path.join(cwd or "", argv[0])
    else:
        exe = shutil.which(argv[0], path=full_env.get("PATH"))
    if not exe or not os.path.exists(exe):
        raise LaunchError(f"cannot start `{argv[0]}`: no such program (is it installed in {sys.executable}'s environment?)")
    full_env[MARKER_ENV] = f"{uuid.uuid4().hex[:12]}:{os.getpid()}"
    return subprocess.Popen(
        [sys.executable, GUARDIAN, "--grace", str(proctree.GRACE), "--", *argv],
        stdin=subprocess.PIPE,  # our control line to the guardian; its end-of-file means we are gone
        stdout=stdout,
        stderr=subprocess.PIPE,  # the guardian's status line
        cwd=cwd,
        env=full_env,
        start_new_session=True,  # neither a kernel interrupt nor a kernel restart's killpg reaches it
    )


def start_background(argv: list[str], *, env=None, cwd=None, offline: bool = True, echo: bool | Shown = True) -> Background:
    """Start ``argv`` under a guardian and return at once (a terminal's ``command > log 2>&1 &``); its
    output goes to ``<script>.log`` in ``cwd``. ``env``, ``offline``, ``echo``: as for ``run_command``."""
    full_env, shown = environment_and_shown(argv, env, offline, echo)
    script = next((a for a in argv[1:] if a.endswith(".py")), argv[0])
    log = Path(cwd or os.getcwd()) / f"{Path(script).stem}.log"
    if shown.echo:
        print(replace(shown, as_written=shown.as_written and f"{shown.as_written} &").announce(
            f"{shown.command} > {log.name} 2>&1 &"), end="", flush=True)
    with open(log, "wb") as out:
        proc = _guarded(argv, full_env, cwd, stdout=out)
    if shown.echo:
        print(f"[nbtools] running in the background (guardian pid {proc.pid}); output in {log.name}")
    return Background(shown.command, proc, log, full_env["TMPDIR"])


def stop_background() -> list[int]:
    """Stop this process's background launches that still run, and tidy those that ended (their private
    TMPDIR, their guardian's exit status): the running ones' guardian pids (``Session.close``)."""
    running = [bg for bg in list(_STARTED) if bg.running()]
    for bg in list(_STARTED):
        bg.stop()
    return [bg.pid for bg in running]


class Background:
    """A command started with ``%launch --background`` (``start_background``).

    It runs under a guardian like every launch: when the kernel restarts or exits, when ``stop()``
    is called, or when the session closes (``S.close()`` stops every launch this kernel started),
    its whole tree is stopped. Its output goes to ``log``. ``wait()`` returns its exit code.
    """

    def __init__(self, command, proc, log, private_tmp):
        self.command, self.proc, self.log, self._tmp = command, proc, log, private_tmp
        self.pid = proc.pid  # the guardian's; `python -m nbtools ps` lists the launch under it
        self.plan: LaunchPlan | None = None
        self.port: int | None = None
        self.returncode: int | None = None
        self._ended_status: dict | None = None  # the guardian's status line, read once
        _STARTED.add(self)

    @property
    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace") if self.log.exists() else ""

    def running(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float | None = None) -> int | None:
        """Its exit code once it ended (waits up to ``timeout`` s; None if still running)."""
        if self._ended_status is not None:
            return self.returncode
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        return self._ended(_status(self.proc))

    def stop(self) -> int | None:
        """Stop its whole tree now (as the guardian does when the kernel goes); its exit code."""
        if self._ended_status is not None:
            return self.returncode
        return self._ended(_halt(self.proc) if self.running() else _status(self.proc))

    def _ended(self, status: dict) -> int | None:
        self._ended_status = status
        self.returncode = status.get("returncode")
        shutil.rmtree(self._tmp, ignore_errors=True)
        _STARTED.discard(self)
        return self.returncode

    def __repr__(self) -> str:
        state = "running" if self.running() else f"exit {self.wait(0)}"
        return f"<Background: {state}, guardian pid {self.pid}, output in {self.log.name}>"


_STARTED: weakref.WeakSet[Background] = weakref.WeakSet()  # not yet ended; a weak set: a forgotten one is found by its mark


def _status(proc: subprocess.Popen) -> dict:
    """The guardian's status line (its last JSON line on stderr), once it has exited."""
    proc.wait()
    text = proc.stderr.read().decode("utf-8", errors="replace") if proc.stderr else ""
    # stdout: the reader thread owns it (closing it would wait on it)
    for stream in filter(None, (proc.stdin, proc.stderr)):
        with contextlib.suppress(OSError):
            stream.close()
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                break
    return {"returncode": None, "reason": f"exit {proc.returncode}: {text.strip()[-2000:]}"}


def _halt(proc: subprocess.Popen, how: str = "stop") -> dict:
    """Ask the guardian to stop the whole tree and wait for it; a second Ctrl-C asks it to kill at once."""
    wait = proctree.GRACE + 5
    while True:
        with contextlib.suppress(OSError, ValueError):
            if proc.stdin and not proc.stdin.closed:
                proc.stdin.write(how.encode() + b"\n")
                proc.stdin.flush()
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            proctree.kill_now(proc.pid)  # the guardian itself is wedged (never seen); its tree then re-parents to init
            proc.wait()
        except KeyboardInterrupt:
            how, wait = "kill", 3.0  # impatient: kill now, keep waiting only briefly
            continue
        return _status(proc)


