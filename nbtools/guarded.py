"""Run a command under the guardian (guardian.py): its output streamed into the cell and kept, its whole
process tree stopped on timeout, failure, Ctrl-C (JupyterLab's stop button) and kernel restart.

``run_command`` runs one and waits; ``start_background`` starts one and returns a ``Background`` handle.
Both print the command a learner would type (``Shown``), set PYTHONUNBUFFERED=1 and UTF-8 output, keep
Hugging Face offline, and give the command a private TMPDIR. ``launch`` runs what decide.py decided (one
``LaunchSpec``, or 06's machines together): it writes the files the specs name, picks a free rendezvous port, and
reruns on a port taken meanwhile or a gloo teardown abort (at most twice); ``accelerate_launch`` decides and runs.
Whether a failure raises is decided in one place, ``settle``, from the verdict diagnose.judged gave the output.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import proctree
from .decide import FROM_SESSION, LaunchCall, LaunchSpec, launch_spec, shell_line
from .device import DeviceInfo
from .diagnose import CommandResult, gloo_exit_abort, judged, timeout_message, unglue_warning
from .errors import LaunchError, LaunchTimeout

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

    def announce(self, real: str, also: dict[str, str] | None = None) -> str:
        """The lines printed before ``real`` runs: as written, then as it runs here, why, what else is set (``also``:
        the variables set beyond the printed ones)."""
        if not self.as_written or self.as_written.strip() == real.strip():
            text = f"$ {real}\n"
        else:
            text = f"$ {self.as_written}\n# runs here as: {real}\n" + (f"# why: {self.why}\n" if self.why else "")
        if also:
            text += "# also set: " + shell_line([], also).strip() + "\n"
        return text


def as_shown(echo: bool | Shown) -> Shown:
    return echo if isinstance(echo, Shown) else Shown(echo=bool(echo))


def environment(env: dict[str, str | None] | None, offline: bool) -> tuple[dict, dict[str, str]]:
    """(the command's whole environment, what it sets beyond ``env``). ``env`` is added to this process' environment
    (a None value removes that variable) and shown in the printed command; the ``# also set:`` line names the rest
    (the offline and UTF-8 switches, unbuffered output)."""
    base = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONIOENCODING="utf-8", PYTHONUTF8="1")
    full_env = {k: v for k, v in {**base, **(OFFLINE_ENV if offline else {}), **(env or {})}.items() if v is not None}
    also = {k: v for k, v in full_env.items() if (env or {}).get(k) is None and os.environ.get(k) != v}
    return full_env, also


def run_command(argv: list[str], *, env: dict[str, str | None] | None = None, cwd: str | os.PathLike | None = None,
                timeout: float | None = None, check: bool = True, offline: bool = True,
                echo: bool | Shown = True) -> CommandResult:
    """Run ``argv`` streaming its output; stop its whole process tree on any way out.

    ``env``: see ``environment``. ``echo``: print the command and stream its output (True), nothing (False),
    or a ``Shown``. A non-zero exit, an error marker (diagnose.ERROR_MARKERS) or the timeout raises,
    unless ``check`` is False: then the result is handed back, failed or not (``settle``).
    """
    shown = as_shown(echo)
    command = shown.command or shell_line(argv, {k: v for k, v in (env or {}).items() if v is not None})
    return settle(_stream(argv, env, cwd, timeout, offline, shown, command), check)


def settle(result: CommandResult | None, check: bool) -> CommandResult | None:
    """The one place a failure raises (the verdict is diagnose.judged's): any failure, its timeout included, where
    ``check``; else the result, failed or not."""
    if check and result is not None and result.error is not None:
        raise result.error
    return result


@dataclass
class _Output:
    """The guardian's output, read by a thread (``pump``, started by ``_stream``) as it comes: kept, and echoed to
    ``out`` if given."""

    proc: subprocess.Popen
    out: object  # a text stream, or None: kept, not echoed
    reader: threading.Thread | None = None
    lines: list[str] = field(default_factory=list)
    eof: bool = False
    _q: queue.Queue = field(default_factory=queue.Queue)

    def pump(self) -> None:
        assert self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, b""):
            self._q.put(raw.decode("utf-8", errors="replace"))
        self._q.put(None)

    def read(self, wait: float | None = 0.1, echo: bool = True, last: bool = False) -> None:
        """Take every line that has come, waiting up to ``wait`` s for the first (None: not waiting); after
        end-of-file, wait up to ``wait`` s for the guardian to exit instead. ``last``: the reader joined first and the
        pipe closed (unless something still holds it), then what is left taken."""
        if last and self.reader is not None:
            self.reader.join(timeout=5)
            if not self.reader.is_alive() and self.proc.stdout:  # else something still holds the pipe
                self.proc.stdout.close()
        if self.eof:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=wait or 0)
            return
        with contextlib.suppress(queue.Empty):
            item = self._q.get(timeout=wait) if wait else self._q.get_nowait()
            while item is not None:
                item = unglue_warning(item)
                self.lines.append(item)
                if echo and self.out is not None:
                    self.out.write(item)
                    self.out.flush()
                item = self._q.get_nowait()
            self.eof = True


def _stream(argv, env, cwd, timeout, offline: bool, shown: Shown, command: str) -> CommandResult:
    """Start ``argv`` under a guardian (guardian.py), pump its output, stop its tree on any way out; the result
    as diagnose.judged reads it (a timeout's: LaunchTimeout)."""
    full_env, also = environment(env, offline)
    out = sys.stdout
    if shown.echo:
        print(shown.announce(command, also), end="", flush=True)
    start = time.monotonic()
    proc = _guarded(argv, full_env, cwd, stdout=subprocess.PIPE)
    output = _Output(proc, out if shown.echo else None)
    output.reader = threading.Thread(target=output.pump, daemon=True)
    output.reader.start()
    deadline = None if timeout is None else start + timeout
    try:
        while not output.eof or proc.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                return _stop_at_timeout(proc, output, argv, start, timeout, shown, command)
            output.read()
    except KeyboardInterrupt:
        n = len(_halt(proc).get("killed") or [])
        print(f"\n[nbtools] interrupted: stopped `{command[:80]}` and every process it started"
              f"{f' ({n} had to be killed)' if n else ''}; none is left running.", file=out, flush=True)
        raise
    finally:
        if proc.poll() is None:  # any other way out of the loop (an exception while printing, ...)
            _halt(proc)
        output.read(None, last=True)
        shutil.rmtree(full_env["TMPDIR"], ignore_errors=True)
    status = _status(proc)
    if status.get("returncode") is None:
        raise LaunchError(f"the launch guardian failed: {status.get('reason')}\n  $ {command}")
    result = judged(command, argv, status["returncode"], "".join(output.lines), time.monotonic() - start,
                    status.get("killed") or [], shown.as_written)
    if shown.echo and result.notes:
        print("".join(note + "\n" for note in result.notes), end="", file=out, flush=True)
    return result


def _stop_at_timeout(proc, output: _Output, argv, start, timeout, shown: Shown, command: str) -> CommandResult:
    """The launch ran past ``timeout``: stop its tree; its result fails with LaunchTimeout and what it printed."""
    output.read(None)
    before = "".join(output.lines)  # what it printed before we stopped it
    status = _halt(proc)
    output.read(None, echo=False, last=True)
    text = "".join(output.lines)
    result = CommandResult(command, list(argv), -9, text, time.monotonic() - start,
                           killed=status.get("killed") or [], as_written=shown.as_written, clean=text)
    result.error = LaunchTimeout(timeout_message(result, before, timeout, shown.timeout_name), result)
    return result


def _guarded(argv, full_env, cwd, stdout) -> subprocess.Popen:
    """Start ``argv`` under a guardian (guardian.py) in a new session; its stdin is our control line."""
    if os.path.dirname(argv[0]):  # a path: relative to cwd, as Popen (and the guardian) resolve it
        exe = os.path.join(cwd or "", argv[0])
    else:
        exe = shutil.which(argv[0], path=full_env.get("PATH"))
    if not exe or not os.path.exists(exe):
        raise LaunchError(f"cannot start `{argv[0]}`: no such program (is it installed in {sys.executable}'s environment?)")
    full_env[MARKER_ENV] = f"{uuid.uuid4().hex[:12]}:{os.getpid()}"
    # A private TMPDIR, removed when it ends: torch elastic and torch leave torchelastic_* and
    # torchinductor_* folders in the temp dir at every launch otherwise.
    full_env["TMPDIR"] = tempfile.mkdtemp(prefix="nbtools-tmp-")
    return subprocess.Popen(
        [sys.executable, GUARDIAN, "--grace", str(proctree.GRACE), "--", *argv],
        stdin=subprocess.PIPE,  # our control line to the guardian; its end-of-file means we are gone
        stdout=stdout,
        stderr=subprocess.PIPE,  # the guardian's status line
        cwd=cwd,
        env=full_env,
        start_new_session=True,  # neither a kernel interrupt nor a kernel restart's killpg reaches it
    )


def start_background(argv: list[str], *, env=None, cwd=None, offline: bool = True, echo: bool | Shown = True,
                     command: str | None = None) -> Background:
    """Start ``argv`` under a guardian and return at once (a terminal's ``command > log 2>&1 &``); its
    output goes to ``<script>.log`` in ``cwd``. ``env``, ``offline``, ``echo``: as for ``run_command``; ``command``:
    the line printed (default: the echo's, else ``argv`` with ``env``)."""
    shown = as_shown(echo)
    command = command or shown.command or shell_line(argv, {k: v for k, v in (env or {}).items() if v is not None})
    full_env, also = environment(env, offline)
    script = next((a for a in argv[1:] if a.endswith(".py")), argv[0])
    log = Path(cwd or os.getcwd()) / f"{Path(script).stem}.log"
    if shown.echo:
        print(Shown(as_written=shown.as_written and f"{shown.as_written} &", why=shown.why).announce(
            f"{command} > {log.name} 2>&1 &", also), end="", flush=True)
    with open(log, "wb") as out:
        proc = _guarded(argv, full_env, cwd, stdout=out)
    if shown.echo:
        print(f"[nbtools] running in the background (guardian pid {proc.pid}); output in {log.name}")
    return Background(command, proc, log, full_env["TMPDIR"])


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
        self.plan: LaunchSpec | None = None
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




# ---------------------------------------------------------------- running what decide.py decided

MAX_ABORT_RERUNS = 2  # reruns of a CPU launch whose only failure is gloo aborting a rank at exit
ABORT_RERUN_SAID = "running the whole launch again"  # in the line a rerun prints (the bench counts them)
_PORT_IN_USE = re.compile(r"address already in use|EADDRINUSE|errno: 98", re.IGNORECASE)


def write_files(files) -> None:
    """Each (path, text) a spec names, rewritten only where it differs, and whole (a process starting meanwhile never
    reads half a file): the launch's config file, the hidden-cards shim (decide.py decides both, writes neither)."""
    for name, text in files:
        path = Path(name)
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.with_suffix(f".{os.getpid()}").write_text(text, encoding="utf-8")
            os.replace(path.with_suffix(f".{os.getpid()}"), path)


def launch(specs: LaunchSpec | list[LaunchSpec], *, check: bool = True, offline: bool = True, echo: bool | Shown = True,
           background: bool = False, together: Callable[[], CommandResult | None] | None = None
           ) -> CommandResult | Background | None:
    """Run the launch ``specs`` decided (decide.launch_spec): the files they name written first; on a port taken
    meanwhile retry on another; on a gloo teardown abort rerun, at most twice; a failure raised by ``settle``.
    ``together``: 06's machines, run at once (machines.run_all), answering the failure that decides a rerun (None: all
    passed); one spec otherwise, its output streamed, printed as ``echo`` says (a ``Shown``, else one built once from
    the spec: the command as written, the why line, the timeout's name).

    torch's gloo aborts a rank at exit now and then, after all its work and even after
    ``end_training()`` (measured on a 2-core CPU with torch 2.14.1: about 1 launch in 8 of an
    evaluation script). Each rerun is said in the cell; a third abort fails the launch.
    """
    specs = [specs] if isinstance(specs, LaunchSpec) else specs
    spec, written = specs[0], specs[0].call.command
    write_files(f for s in specs for f in s.files)
    shown = echo if isinstance(echo, Shown) else Shown(echo, None, written and written.text, spec.why, spec.timeout_name)
    if shown.echo and spec.notes and together is None:
        print("\n".join(spec.notes))
    abort_reruns, tries = 0, 2 + MAX_ABORT_RERUNS  # the first try, one more after a port taken meanwhile, the reruns
    for attempt in range(tries):
        port = None if together or spec.machine or spec.num_processes == 1 else spec.port or free_port()
        if background:
            bg = start_background(spec.argv(port), env=spec.run_env(), cwd=spec.cwd, offline=offline, echo=shown,
                                  command=spec.shown(port))
            bg.plan, bg.port = spec, port
            return bg
        if together is None:
            result = _stream(spec.argv(port), spec.run_env(), spec.cwd, spec.timeout, offline, shown, spec.shown(port))
            result.plan, result.port = spec, port  # the result of this launch, with its spec and port
        else:
            result = together()
        passed = result is None or result.returncode == 0
        if passed or attempt + 1 == tries or (retry := _retry_reason(result, spec, abort_reruns)) is None:
            break
        abort_reruns += retry == "abort"
        if shown.echo:
            print(retry_line(retry, port, abort_reruns, spec))
    return settle(result, check) if together is None else result  # the machines' failure is theirs to compose


def _retry_reason(result: CommandResult, spec: LaunchSpec, abort_reruns: int) -> str | None:
    """"port" (taken meanwhile), "abort" (a gloo teardown abort after the work) or None: keep this result (a timeout is
    never run again). The machines of 06 and a single launch both ask here."""
    if isinstance(result.error, LaunchTimeout):
        return None
    if spec.port is None and not spec.machine and spec.num_processes > 1 and _PORT_IN_USE.search(result.output):
        return "port"
    return "abort" if abort_reruns < MAX_ABORT_RERUNS and gloo_exit_abort(result.output, spec) else None


def retry_line(reason: str, port: int | None, abort_reruns: int, spec: LaunchSpec) -> str:
    if reason == "port":
        return f"[nbtools] port {port} was taken meanwhile; retrying on another free port"
    whose = ("torch's gloo on CPU" if spec.kind == "cpu" else
             "the simulated NPU's transport, which is torch's gloo under a simulated hccl: not a property of hccl")
    return ("[nbtools] a rank aborted while exiting AFTER its work ('terminate called without an active "
            f"exception': a known teardown race of {whose}); {ABORT_RERUN_SAID} "
            f"({abort_reruns} of at most {MAX_ABORT_RERUNS}) -- the output below is what the checks see")


@dataclass(frozen=True, kw_only=True)
class LaunchOptions:
    """The rest of what ``accelerate_launch`` takes, by name: a misspelt one is a TypeError naming it here."""

    env: dict[str, str] | None = None  # the written launch: variables in front, flags before the script
    extra_flags: tuple[str, ...] = ()
    cwd: str | os.PathLike | None = None
    info: DeviceInfo | None = None
    check: bool = True  # how it runs (launch)
    offline: bool = True
    background: bool = False
    echo: bool = True  # what is shown
    as_written: str | None = None
    timeout_name: str = "timeout_s"
    fit: bool = False  # the learner's own job: fewer cards than --num_processes shrinks the count (decide.plan)


def accelerate_launch(script: str | os.PathLike, *script_args: str, num_processes: int | None = None,
                      mixed_precision: str | None = None, device: str | None = None,
                      timeout: float | None | object = FROM_SESSION,
                      options: LaunchOptions = LaunchOptions()) -> CommandResult | Background:
    """``accelerate launch script ...`` on ``num_processes`` ranks, decided by decide.launch_spec and run by
    ``launch``; the why line is always the one the launch rule derives. None: from the open session, else the defaults."""
    o = options
    call = LaunchCall.of(script, *script_args, num_processes=num_processes, mixed_precision=mixed_precision, env=o.env,
                         extra_flags=o.extra_flags)  # a port: ("--main_process_port", N) among them
    spec = launch_spec(call, info=o.info, device=device, timeout=timeout, cwd=o.cwd, fit=o.fit)
    shown = Shown(echo=o.echo, as_written=o.as_written, why=spec.why, timeout_name=o.timeout_name)
    return launch(spec, check=o.check, offline=o.offline, echo=shown, background=o.background)
