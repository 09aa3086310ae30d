"""Run `accelerate launch` (or any command) from a notebook cell, safely.

- prints the exact command a learner would type in a terminal, env prefix included;
- streams the output live into the cell and captures it;
- raises LaunchError on a non-zero exit (with the failing rank's last lines), on an
  error marker in the output, and LaunchTimeout past the timeout;
- runs the child in its own session and stops the whole process tree (workers
  included) on timeout, failure and KeyboardInterrupt (JupyterLab's stop button);
- picks a free rendezvous port, sets PYTHONUNBUFFERED=1, keeps Hugging Face offline.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import queue
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from .checks import LaunchError, LaunchTimeout, parse_kv
from .commands import executable
from .device import CANN_FIX, DeviceInfo, LaunchPlan
from .params import validate
from .proctree import GRACE, kill_now

GUARD = str(Path(__file__).with_name("guard.py"))  # the parent of every command started here
MARKER_ENV = "NBTOOLS_LAUNCH"  # "<launch id>:<starter pid>" on every process of a launch (`nbtools ps`)
MAX_ABORT_RERUNS = 2  # reruns of a CPU launch whose only failure is gloo aborting a rank at exit
ABORT_RERUN_SAID = "running the whole launch again"  # in the line a rerun prints (the bench counts them)
# The quick-start's doc-test engine fails a run whose output holds any of these.
ERROR_MARKERS = ("Traceback (most recent call last)", "[ERROR]", "ERR99999")
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
# Known symptoms in a failed launch's output, and what to do about them.
HINTS = (
    (
        "terminate called without an active exception",
        "a rank aborted in gloo's teardown (gloo aborts at exit): end the script with "
        "accelerator.end_training(); if it already does, this is a rare torch teardown race: run it again",
    ),
    (
        "EADDRINUSE",
        "another process holds this rendezvous port (two launches at once?): pass a free one with "
        "--main_process_port (nbtools.accelerate_launch picks one itself)",
    ),
    ("libhccl.so", f"CANN's libraries are not loaded: {CANN_FIX}"),
    (
        "Cannot re-initialize NPU in forked subprocess",
        "the NPU was initialised in this kernel before notebook_launcher forked: restart the kernel "
        "and call notebook_launcher before any .to('npu')",
    ),
)
# Given to every launch as --config_file, so that the user's own default config is never read.
# Every value is Accelerate's own default; the launch's flags decide the rest.
NEUTRAL_CONFIG = {
    "compute_environment": "LOCAL_MACHINE",
    "distributed_type": "NO",
    "mixed_precision": "no",
    "use_cpu": False,
    "debug": False,
    "num_machines": 1,
    "gpu_ids": "all",
}
_PORT_IN_USE = re.compile(r"address already in use|EADDRINUSE|errno: 98", re.IGNORECASE)
# A warning that one rank writes between another rank's text and its newline (unbuffered, print() writes
# the two separately) lands in the middle of that line: `epoch=3 train_loss=0.0898/.../c10d_logger.py:83:
# FutureWarning: ...`. It is put back on a line of its own. Two kinds: Python's ("<file>.py:<line>:
# <Category>Warning: ") and torch's C++ log lines ("[rank1]:[W1201 23:22:48.794764329 logger.cpp:329] ").
_WARNING_START = re.compile(
    r"(?:/|[A-Za-z]:\\)[^\s:]*\.py:\d+: \w*Warning: "
    r"|(?:\[(?:rank|default)\d+\]:)?\[[WEI]\d{4} \d\d:\d\d:\d\d\.\d+ +\d* *[\w./-]+:\d+\] "
)


def unglue_warning(line: str) -> str:
    """``line`` with a warning glued into its middle moved onto a line of its own."""
    m = _WARNING_START.search(line)
    if m is None or m.start() == 0 or line[m.start() - 1].isspace():
        return line
    return line[: m.start()] + "\n" + line[m.start():]


@dataclass
class Result:
    command: str  # as a learner would type it
    argv: list[str]
    returncode: int
    output: str
    duration_s: float
    plan: LaunchPlan | None = None
    port: int | None = None
    killed: list[int] = field(default_factory=list)
    written: str | None = None  # the command as the learner wrote it, when it differs from ``command``
    notes: list[str] = field(default_factory=list)  # benign oddities the launcher recognised and explained

    @property
    def kv(self) -> dict[str, str]:
        """``key=value`` lines of the output (see expected.parse_kv)."""
        return parse_kv(self.output)

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def __repr__(self) -> str:  # a cell ending in `%cmd ...` shows this, below the streamed output
        lines = len(self.output.splitlines())
        return f"<Result: exit {self.returncode}, {lines} line(s) of output in {self.duration_s:.1f} s>"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def shell_line(argv: list[str], env: dict[str, str] | None = None) -> str:
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
    return (prefix + " " if prefix else "") + shlex.join(argv)


def announce(real: str, written: str | None = None, why: str = "", also: dict[str, str] | None = None) -> str:
    """The lines a cell prints before a command runs: what the learner typed, then what really runs, then
    ``also``: the variables set for it beyond those in the command (a terminal gets them with ``export``)."""
    if not written or written.strip() == real.strip():
        text = f"$ {real}\n"
    else:
        text = f"$ {written}\n# runs here as: {real}\n" + (f"# why: {why}\n" if why else "")
    if also:
        text += "# also set: " + " ".join(f"{k}={shlex.quote(v)}" for k, v in also.items()) + "\n"
    return text


def implicit_env(full_env: dict[str, str], shown: dict[str, str] | None = None) -> dict[str, str]:
    """What ``run_command`` sets beyond the shown ``env`` and this process' own environment (the offline and
    UTF-8 switches, unbuffered output), for the ``# also set:`` line; the private TMPDIR is not a setting."""
    return {
        k: v for k, v in full_env.items()
        if k != "TMPDIR" and k not in (shown or {}) and os.environ.get(k) != v
    }


def run_command(
    argv: list[str],
    *,
    env: dict[str, str] | None = None,
    unset: tuple[str, ...] = (),
    cwd: str | os.PathLike | None = None,
    timeout: float | None = None,
    timeout_name: str = "timeout",
    check: bool = True,
    offline: bool = True,
    background: bool = False,
    # what the cell shows (nothing else depends on these):
    echo: bool = True,
    shown: str | None = None,
    written: str | None = None,
    why: str = "",
) -> Result | Background:
    """Run ``argv`` streaming its output; stop its whole process tree on any way out.

    ``env`` is added to the current environment (``unset`` removed from it) and shown in the
    printed command; ``shown`` replaces the printed command. ``written`` is the command as a
    learner types it (the quick-start's form): it is printed first, and when it differs from what
    really runs, the real command follows with ``why``. A non-zero exit, an error marker
    (ERROR_MARKERS) or the timeout raises, unless ``check`` is False (the timeout always raises).
    ``background``: start it and return a ``Background`` at once (no timeout; see that class).
    """
    full_env = dict(os.environ)
    full_env["PYTHONUNBUFFERED"] = "1"
    # Children write UTF-8 whatever the locale (LANG=C, a GBK locale): we decode their output as UTF-8.
    full_env["PYTHONIOENCODING"] = "utf-8"
    full_env["PYTHONUTF8"] = "1"
    if offline:
        full_env.update(OFFLINE_ENV)
    full_env.update(env or {})
    for name in unset:
        full_env.pop(name, None)
    # A private TMPDIR, removed afterwards: torch elastic and torch leave torchelastic_* and
    # torchinductor_* folders in the temp dir at every launch otherwise.
    also = implicit_env(full_env, env)
    private_tmp = tempfile.mkdtemp(prefix="nbtools-tmp-")
    full_env["TMPDIR"] = private_tmp
    command = shown or shell_line(argv, env)
    if background:
        return Background.start(argv, full_env, cwd=cwd, command=command, written=written, why=why,
                                also=also, echo=echo, private_tmp=private_tmp)
    try:
        return _stream(
            argv, full_env, cwd=cwd, timeout=timeout, timeout_name=timeout_name, check=check,
            echo=echo, command=command, written=written, why=why, also=also,
        )
    finally:
        shutil.rmtree(private_tmp, ignore_errors=True)


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
        """Take the next line, waiting up to 0.1 s (after end-of-file: just a short pause)."""
        if self.eof:
            time.sleep(0.02)
            return
        try:
            self._take(self._q.get(timeout=0.1))
        except queue.Empty:
            pass

    def drain(self, echo: bool = True) -> None:
        while True:
            try:
                self._take(self._q.get_nowait(), echo)
            except queue.Empty:
                return

    def close(self) -> None:
        self._reader.join(timeout=5)
        if not self._reader.is_alive() and self.proc.stdout:  # else something still holds the pipe
            self.proc.stdout.close()

    @property
    def text(self) -> str:
        return "".join(self.lines)


def _stream(argv, full_env, *, cwd, timeout, timeout_name, check, echo, command, written, why, also=None) -> Result:
    """Start ``argv`` under a guardian (guard.py), pump its output, stop its tree on any way out."""
    out = sys.stdout
    if echo:
        out.write(announce(command, written, why, also))
        out.flush()
    start = time.monotonic()
    proc = _guarded(argv, full_env, cwd, stdout=subprocess.PIPE)
    output = _Output(proc, out if echo else None)
    deadline = None if timeout is None else start + timeout
    try:
        while not output.eof or proc.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                _stop_at_timeout(proc, output, command, argv, start, timeout, timeout_name)
            output.read()
    except KeyboardInterrupt:
        n = len(_halt(proc).get("killed") or [])
        out.write(
            f"\n[nbtools] interrupted: stopped `{command[:80]}` and every process it started"
            f"{f' ({n} had to be killed)' if n else ''}; none is left running.\n"
        )
        out.flush()
        raise
    finally:
        if proc.poll() is None:  # any other way out of the loop (an exception while printing, ...)
            _halt(proc)
        output.close()
    output.drain()
    status = _status(proc)
    if status.get("returncode") is None:
        raise LaunchError(f"the launch guardian failed: {status.get('reason')}\n  $ {command}")
    _, notes = benign_blocks(output.text, status["returncode"])
    result = Result(command, list(argv), status["returncode"], output.text, time.monotonic() - start,
                    killed=status.get("killed") or [], written=written, notes=notes)
    if echo and notes:
        out.write("".join(note + "\n" for note in notes))
        out.flush()
    if check:
        _raise_on_failure(result)
    return result


def _stop_at_timeout(proc, output: _Output, command, argv, start, timeout, timeout_name) -> None:
    """The launch ran past ``timeout``: stop its tree and raise LaunchTimeout with what it printed."""
    output.drain()
    before = output.text  # what it printed before we stopped it
    status = _halt(proc)
    output.close()
    output.drain(echo=False)
    result = Result(command, list(argv), -9, output.text, time.monotonic() - start, killed=status.get("killed") or [])
    raise LaunchTimeout(_timeout_message(result, before, timeout, timeout_name), result)


def _guarded(argv, full_env, cwd, stdout) -> subprocess.Popen:
    """Start ``argv`` under a guardian (guard.py) in a new session; its stdin is our control line."""
    if os.path.dirname(argv[0]):  # a path: relative to cwd, as Popen (and the guardian) resolve it
        exe = os.path.join(cwd or "", argv[0])
    else:
        exe = shutil.which(argv[0], path=full_env.get("PATH"))
    if not exe or not os.path.exists(exe):
        raise LaunchError(f"cannot start `{argv[0]}`: no such program (is it installed in {sys.executable}'s environment?)")
    full_env[MARKER_ENV] = f"{uuid.uuid4().hex[:12]}:{os.getpid()}"
    return subprocess.Popen(
        [sys.executable, GUARD, "--grace", str(GRACE), "--", *argv],
        stdin=subprocess.PIPE,  # our control line to the guardian; its end-of-file means we are gone
        stdout=stdout,
        stderr=subprocess.PIPE,  # the guardian's status line
        cwd=cwd,
        env=full_env,
        start_new_session=True,  # neither a kernel interrupt nor a kernel restart's killpg reaches it
    )


class Background:
    """A command started with ``%launch --background`` (a terminal's ``command > log 2>&1 &``).

    It runs under a guardian like every launch: when the kernel restarts or exits, when
    ``stop()`` is called, or when the session closes (``S.close()``), its whole tree is stopped.
    Its output goes to ``log`` in the working directory. ``wait()`` returns its exit code.
    """

    running_now: list[Background] = []

    def __init__(self, command, proc, log, private_tmp):
        self.command, self.proc, self.log, self._tmp = command, proc, log, private_tmp
        self.pid = proc.pid  # the guardian's; `python -m nbtools ps` lists the launch under it
        self.plan: LaunchPlan | None = None
        self.port: int | None = None
        self.returncode: int | None = None
        self._ended_status: dict | None = None  # the guardian's status line, read once

    @classmethod
    def start(cls, argv, full_env, *, cwd, command, written, why, also, echo, private_tmp) -> Background:
        script = next((a for a in argv[1:] if a.endswith(".py")), argv[0])
        log = Path(cwd or os.getcwd()) / f"{Path(script).stem}.log"
        if echo:
            sys.stdout.write(announce(f"{command} > {log.name} 2>&1 &", written and f"{written} &", why, also))
            sys.stdout.flush()
        with open(log, "wb") as out:
            proc = _guarded(argv, full_env, cwd, stdout=out)
        bg = cls(command, proc, log, private_tmp)
        cls.running_now.append(bg)
        if echo:
            print(f"[nbtools] running in the background (guardian pid {proc.pid}); output in {log.name}")
        return bg

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
        if self in Background.running_now:
            Background.running_now.remove(self)
        return self.returncode

    @classmethod
    def stop_all(cls) -> list[str]:
        """Stop every background command still running; what was stopped."""
        stopped = [bg.command for bg in list(cls.running_now) if bg.running()]
        for bg in list(cls.running_now):
            bg.stop()
        return stopped

    def __repr__(self) -> str:
        state = "running" if self.running() else f"exit {self.wait(0)}"
        return f"<Background: {state}, guardian pid {self.pid}, output in {self.log.name}>"


def _status(proc: subprocess.Popen) -> dict:
    """The guardian's status line (its last JSON line on stderr), once it has exited."""
    proc.wait()
    text = proc.stderr.read().decode("utf-8", errors="replace") if proc.stderr else ""
    for stream in (proc.stdin, proc.stderr):  # stdout: the reader thread owns it (closing it would wait on it)
        try:
            if stream:
                stream.close()
        except OSError:
            pass
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                break
    return {"returncode": None, "reason": f"exit {proc.returncode}: {text.strip()[-2000:]}"}


def _halt(proc: subprocess.Popen, how: str = "stop") -> dict:
    """Ask the guardian to stop the whole tree and wait for it; a second Ctrl-C asks it to kill at once."""
    wait = GRACE + 5
    while True:
        try:
            if proc.stdin and not proc.stdin.closed:
                proc.stdin.write(how.encode() + b"\n")
                proc.stdin.flush()
        except (OSError, ValueError):
            pass
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            kill_now(proc.pid)  # the guardian itself is wedged (never seen); its tree then re-parents to init
            proc.wait()
            break
        except KeyboardInterrupt:
            how, wait = "kill", 3.0  # impatient: kill now, keep waiting only briefly
    return _status(proc)


def _tail(text: str, n: int = 25) -> str:
    return "\n".join("    " + ln for ln in text.rstrip().splitlines()[-n:])


def failing_rank(output: str) -> int | None:
    """The first rank whose own traceback appears, else the rank torch elastic names as root cause."""
    tb = re.search(r"^\[rank(\d+)\]:\s*Traceback", output, re.MULTILINE)
    if tb:
        return int(tb.group(1))
    root = re.search(r"Root Cause.*?rank\s*:\s*(\d+)", output, re.DOTALL)
    return int(root.group(1)) if root else None


def _rank_lines(output: str, rank: int, n: int = 20) -> str:
    mine = [ln for ln in output.splitlines() if ln.startswith(f"[rank{rank}]:")]
    return "\n".join("    " + ln for ln in mine[-n:])


def _gloo_exit_abort(output: str, plan: LaunchPlan) -> bool:
    """A gloo launch (CPU, or the simulated NPU's hccl) whose only failure is a rank aborting in teardown,
    with no Python error. Never a real NPU's or GPU's: hccl and nccl get no rerun."""
    return (
        plan.gloo
        and "terminate called without an active exception" in output
        and re.search(r"^\[rank\d+\]:\s*Traceback", output, re.MULTILINE) is None
    )


# torch's log prefix, e.g. "E1201 04:10:11.123000 1234 torch/distributed/elastic/agent/server/api.py:1008] ",
# possibly behind a "[rank1]:" tag; multi-line records repeat it on every line.
_LOG_PREFIX = re.compile(r"^(?:\[rank\d+\]:)?(?:\[?[IWEF]\d{4} [\d:.]+ +\d+ [^\]]*\] ?)?")
EXIT_BARRIER = "Error waiting on exit barrier"
EXIT_BARRIER_NOTE = (
    "[nbtools] note: torch elastic logged \"Error waiting on exit barrier\" with a traceback above AFTER every rank "
    "of this machine had finished and the launch exited 0: the agent that holds the rendezvous store (machine 0) had "
    "already left. It is benign and is not counted as an error."
)


def benign_blocks(output: str, returncode: int) -> tuple[str, list[str]]:
    """The output without what is known to be benign, and a note for each kind removed.

    Only one thing is benign: torch elastic's exit-barrier error (its log line and the traceback
    under it) in a launch that exited 0, i.e. every rank of this machine finished and exited 0.
    Any other traceback, a non-zero exit, or another marker stays in and still fails the launch.
    """
    if returncode != 0 or EXIT_BARRIER not in output:
        return output, []
    lines = output.splitlines(keepends=True)
    kept: list[str] = []
    i = 0
    removed = False
    while i < len(lines):
        if EXIT_BARRIER not in lines[i]:
            kept.append(lines[i])
            i += 1
            continue
        removed = True
        # torch's logger repeats the record's prefix on every line of it: only lines with THAT prefix are its
        # traceback; a genuine traceback a rank prints right after it has none and stays in
        prefix = _LOG_PREFIX.match(lines[i]).group(0)
        i += 1
        # The traceback(s) that logger.exception appended: frames are indented; the exception line is not;
        # chained exceptions continue after "During handling ..." / "The above exception ...".
        while i < len(lines) and (not prefix or lines[i].startswith(prefix)):
            body = _LOG_PREFIX.sub("", lines[i]).rstrip("\n")
            if body.startswith("Traceback (most recent call last)"):
                i += 1
                while i < len(lines) and _LOG_PREFIX.sub("", lines[i])[:1] in (" ", "\t") and lines[i].startswith(prefix):
                    i += 1
                if i < len(lines) and lines[i].startswith(prefix):
                    i += 1  # the exception line itself
                continue
            if not body.strip() or body.startswith(("During handling of the above", "The above exception was")):
                nxt = next((_LOG_PREFIX.sub("", ln) for ln in lines[i + 1 : i + 3] if ln.strip()), "")
                if nxt.startswith(("Traceback", "During handling", "The above exception")):
                    i += 1
                    continue
            break
    return "".join(kept), ([EXIT_BARRIER_NOTE] if removed else [])


def _raise_on_failure(result: Result, markers: tuple[str, ...] = ERROR_MARKERS) -> None:
    text, _ = benign_blocks(result.output, result.returncode)
    found = [m for m in markers if m in text]
    if result.returncode == 0 and not found:
        return
    head = (
        f"command failed with exit code {result.returncode} after {result.duration_s:.1f} s"
        if result.returncode != 0
        else f"command exited 0 but its output holds the error marker {found[0]!r} ({result.duration_s:.1f} s)"
    )
    rank = failing_rank(result.output)
    if rank is not None and _rank_lines(result.output, rank):
        detail = f"Rank {rank} failed first; its last lines:\n{_rank_lines(result.output, rank)}"
    else:
        detail = f"Last lines of the output:\n{_tail(result.output)}"
    if result.killed:
        detail += f"\n(stopped {len(result.killed)} leftover process(es) of this launch)"
    for needle, hint in HINTS:
        if needle in result.output:
            detail += f"\nhint: {hint}"
    raise LaunchError(f"{head}\n  $ {result.command}\n{detail}", result)


def _timeout_message(result: Result, before: str, timeout: float | None, timeout_name: str) -> str:
    return (
        f"stopped after {timeout_name}={timeout:g} s: the command was still running "
        f"(every process of it has been ended).\n  $ {result.command}\n"
        f"If the machine is only slow, raise `{timeout_name}`; if it hangs (e.g. a rank waiting in a "
        f"collective for a peer that never comes), see its last lines before the stop:\n{_tail(before, 15)}"
    )


@dataclass(frozen=True)
class LaunchSpec:
    """One ``accelerate launch``, decided once (device plan, flags, env); ``argv``/``shown`` for a port.

    ``shown(port)`` is the command line a learner can paste into a terminal in the launch's folder (the
    bench's bare side runs exactly that); ``argv(port)`` is the same with this environment's ``accelerate``.
    """

    plan: LaunchPlan
    script: str
    script_args: tuple[str, ...] = ()
    mixed_precision: str = "no"
    env: tuple[tuple[str, str], ...] = ()  # the plan's variables, then the caller's
    unset: tuple[str, ...] = ()  # ACCELERATE_* variables of this environment that must not reach it
    flags: tuple[str, ...] = ()  # --config_file ..., then the caller's extra flags
    port: int | None = None  # None: a free one per try
    notes: tuple[str, ...] = ()  # what the cell says before the command (fallback, ignored variables)

    def argv(self, port: int | None, shown: bool = False) -> list[str]:
        ports = ["--main_process_port", str(port)] if port else []
        head = ["accelerate" if shown else executable("accelerate"), "launch", *self.plan.flags]
        return [*head, "--mixed_precision", self.mixed_precision, *self.flags, *ports, self.script, *self.script_args]

    def shown(self, port: int | None) -> str:
        return shell_line(self.argv(port, shown=True), dict(self.env))

    def next_port(self) -> int | None:
        return (self.port or free_port()) if self.plan.num_processes > 1 else None


def launch_spec(
    script: str | os.PathLike,
    *script_args: str,
    num_processes: int = 2,
    mixed_precision: str = "no",
    device: str = "auto",
    timeout: float | None = 600,
    port: int | None = None,
    env: dict[str, str] | None = None,
    extra_flags: tuple[str, ...] = (),
    cwd: str | os.PathLike | None = None,
    isolate_config: bool = True,
    info: DeviceInfo | None = None,
) -> LaunchSpec:
    """Validate a launch's parameters and decide it: the device plan, the flags and the env.

    The flags and env come from ``detect().plan(...)``: on NPU/CUDA the visible-devices
    variable, on a CPU-only host ``ACCELERATE_USE_CPU=1 ... --multi_gpu`` (the only way to
    get a real gloo group there).
    """
    info = validate(
        device=device, num_processes=num_processes, mixed_precision=mixed_precision, timeout_s=timeout, info=info
    )
    plan = info.plan(num_processes, device)
    notes = [f"[nbtools] NOTE {plan.note}"] if plan.fallback else []
    run_env = dict(plan.env, **(env or {}))
    # The user's own setup must not change the launch: ACCELERATE_* variables exported in the
    # kernel, and the default config `accelerate config` wrote (distributed_type: DEEPSPEED,
    # mixed_precision: fp16, num_processes: 8, ...), which `accelerate launch` would read.
    unset = foreign_accelerate_vars(run_env)
    if unset:
        notes.append(f"[nbtools] ignoring {', '.join(sorted(unset))} from this environment (the plan sets what the launch needs)")
    isolate = isolate_config and "--config_file" not in extra_flags
    config_flags = launch_config(plan, cwd if cwd is not None else os.getcwd()) if isolate else []
    return LaunchSpec(plan, str(script), tuple(map(str, script_args)), mixed_precision, tuple(run_env.items()), unset,
                      (*config_flags, *extra_flags), port, tuple(notes))


_RUN_OPTIONS = ("check", "echo", "offline", "timeout_name", "written", "why", "background")


def accelerate_launch(script: str | os.PathLike, *script_args: str, **options) -> Result | Background:
    """``accelerate launch`` ``script`` on ``num_processes`` ranks of ``device``, in one call: ``launch_spec``
    decides it (its keywords: ``num_processes=2``, ``mixed_precision``, ``device``, ``timeout=600``, ``port``,
    ``env``, ``extra_flags``, ``cwd``, ``isolate_config``, ``info``) and ``launch`` runs it (``check``, ``echo``,
    ``offline``, ``timeout_name="timeout_s"``, ``written``, ``why``, ``background``)."""
    run = {name: options.pop(name) for name in _RUN_OPTIONS if name in options}
    run.setdefault("timeout_name", "timeout_s")
    spec = launch_spec(script, *script_args, **options)
    return launch(spec, cwd=options.get("cwd"), timeout=options.get("timeout", 600), **run)


def foreign_accelerate_vars(launch_env: dict[str, str]) -> tuple[str, ...]:
    """ACCELERATE_* variables of this environment that the launch does not set itself: to be removed."""
    return tuple(k for k in os.environ if k.startswith("ACCELERATE_") and k not in launch_env)


def launch_config(plan: LaunchPlan, folder: str | os.PathLike) -> list[str]:
    """``["--config_file", NAME]``: Accelerate's defaults for this plan, written as NAME into ``folder`` (the
    launch's working directory) and kept there, so that the printed command runs as printed from it.

    The distributed type is the one ``accelerate launch`` picks by itself: with a config file it no longer
    switches to MULTI_NPU for ``--num_processes N`` on N visible NPUs (it does so only when it reads no
    config), so on NPU the file says MULTI_NPU; everywhere else the plan's flags decide (NO here).
    """
    config = dict(NEUTRAL_CONFIG)
    if plan.kind == "npu" and plan.num_processes > 1:
        config["distributed_type"] = plan.distributed_type
    name = f"accelerate_config_{config['distributed_type'].lower()}.json"
    text = json.dumps(config, indent=2) + "\n"
    path = Path(folder) / name
    try:
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
        return ["--config_file", name]
    except OSError:  # a read-only working directory: a private copy (then the printed path is absolute)
        path = Path(tempfile.mkdtemp(prefix="nbtools-accelerate-")) / name
        path.write_text(text, encoding="utf-8")
        return ["--config_file", str(path)]


@contextlib.contextmanager
def neutral_config():
    """``["--config_file", <a file of NEUTRAL_CONFIG>]`` for the block, so that `accelerate launch` never
    reads the user's own default config; the file is removed afterwards."""
    folder = tempfile.mkdtemp(prefix="nbtools-accelerate-")
    try:
        path = Path(folder) / "neutral_config.json"
        path.write_text(json.dumps(NEUTRAL_CONFIG))
        yield ["--config_file", str(path)]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def launch(spec: LaunchSpec, *, check: bool = True, echo: bool = True, **run_kw) -> Result | Background:
    """Run the launch ``spec`` decided (``run_kw``: ``run_command``'s options); on a port taken meanwhile
    retry on another; on a gloo teardown abort rerun, at most twice.

    torch's gloo aborts a rank at exit now and then, after all its work and even after
    ``end_training()`` (measured on a 2-core CPU with torch 2.14.1: about 1 launch in 8 of an
    evaluation script). Each rerun is said in the cell; a third abort fails the launch.
    """
    if echo and spec.notes:
        print("\n".join(spec.notes))
    tries = 2 + MAX_ABORT_RERUNS  # the first try, one more after a port taken meanwhile, the reruns
    abort_reruns = 0
    for attempt in range(tries):
        port = spec.next_port()
        try:
            result = run_command(spec.argv(port), env=dict(spec.env), shown=spec.shown(port), unset=spec.unset,
                                 check=False, echo=echo, **run_kw)
        except LaunchError as exc:
            if exc.result is not None:
                exc.result = dataclasses.replace(exc.result, plan=spec.plan, port=port)
            raise
        if isinstance(result, Background):
            result.plan, result.port = spec.plan, port
            return result
        result = dataclasses.replace(result, plan=spec.plan, port=port)
        retry = _retry_reason(result, spec, abort_reruns) if attempt + 1 < tries else None
        if retry is None:
            break
        abort_reruns += retry == "abort"
        if echo:
            print(_retry_line(retry, port, abort_reruns, spec.plan))
    if check:
        _raise_on_failure(result)
    return result


def _retry_reason(result: Result, spec: LaunchSpec, abort_reruns: int) -> str | None:
    """"port" (taken meanwhile), "abort" (a gloo teardown abort after the work) or None: keep this result."""
    if result.returncode == 0:
        return None
    if spec.port is None and spec.plan.num_processes > 1 and _PORT_IN_USE.search(result.output):
        return "port"
    if abort_reruns < MAX_ABORT_RERUNS and _gloo_exit_abort(result.output, spec.plan):
        return "abort"
    return None


def _retry_line(reason: str, port: int | None, abort_reruns: int, plan: LaunchPlan) -> str:
    if reason == "port":
        return f"[nbtools] port {port} was taken meanwhile; retrying on another free port"
    whose = ("torch's gloo on CPU" if plan.kind == "cpu" else
             "the simulated NPU's transport, which is torch's gloo under a simulated hccl: not a property of hccl")
    return (
        "[nbtools] a rank aborted while exiting AFTER its work ('terminate called without an active "
        f"exception': a known teardown race of {whose}); {ABORT_RERUN_SAID} "
        f"({abort_reruns} of at most {MAX_ABORT_RERUNS}) -- the output below is what the checks see"
    )
