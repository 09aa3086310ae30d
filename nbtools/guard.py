"""The guardian: parent of every launched command, so that no launch outlives whoever started it
(README, "Runs that leave nothing behind").

``guarded.run_command`` starts this small program in a new session, and it starts the command. It is a
child subreaper (orphans stay its descendants); ``stop`` / ``kill`` on its stdin, its stdin's end (the
starter is gone), or SIGTERM / SIGINT / SIGHUP stop the whole tree; when the command exits it stops what
the command left behind. At exit it writes one JSON line on stderr: ``{"returncode", "killed", "reason"}``.
Run as a script (``python guard.py [--grace S] -- CMD ...``), importing only the standard library, psutil
and its sibling proctree.py, it starts in tens of milliseconds.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import time

import psutil

try:  # run as a script (always, by nbtools): its sibling module; imported as nbtools.guard: the package's
    from .proctree import descendants, terminate_then_kill
except ImportError:
    from proctree import descendants, terminate_then_kill

PR_SET_CHILD_SUBREAPER = 36
POLL_S = 0.02  # how soon the command's exit is noticed (it sets the launch's own overhead)


def _become_subreaper() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


_keep: set[int] = set()  # the command itself: Popen reaps it, so that its exit status is not lost


def _reap() -> None:
    """Collect exited orphans that were re-parented to us (not the command: Popen reaps that one)."""
    try:
        children = psutil.Process().children()
    except psutil.Error:
        return
    for p in children:
        if p.pid in _keep:
            continue
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(p.pid, os.WNOHANG)
        except (psutil.Error, ChildProcessError):
            pass


def stop_all(grace: float) -> list[int]:
    """Stop every live descendant (nbtools.proctree's one stop loop, new ones included); the pids killed."""
    killed = terminate_then_kill(descendants, grace, kill_wait=1.0, reap=False)  # Popen reaps the command
    _reap()
    return killed


_requested: list[str] = []


def _on_signal(signum, _frame) -> None:
    _requested.append(f"signal {signal.Signals(signum).name}")


def _read_request() -> tuple[str, bool] | None:
    """What the starter asked on stdin within POLL_S: (reason, kill at once), or None for nothing."""
    try:
        ready, _, _ = select.select([0], [], [], POLL_S)
    except InterruptedError:
        return None
    if not ready:
        return None
    data = os.read(0, 64)
    if not data:
        return "the process that started this command is gone (kernel restarted, shut down or killed?)", False
    if b"kill" in data:
        return "kill requested", True
    return ("stop requested", False) if b"stop" in data else None


def _watch(child: subprocess.Popen) -> tuple[str, bool]:
    """Wait for the command to end or for a stop request; ("", False) when the command ended."""
    next_reap = time.monotonic()
    while child.poll() is None:
        if _requested:
            return _requested[0], False
        request = _read_request()
        if request is not None:
            return request
        if time.monotonic() >= next_reap:  # orphans that exited: collect them now and then
            _reap()
            next_reap = time.monotonic() + 0.5
    return "", False


def _start(argv: list[str]) -> subprocess.Popen:
    child = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=1,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: signals meant for us do not reach it half-way
    )
    _keep.add(child.pid)
    # Drop our own copy of the output pipe: the starter sees end-of-file as soon as the
    # command and its descendants are gone, without waiting for our bookkeeping.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    return child


def _report(status: dict) -> int:
    sys.stderr.write(json.dumps(status) + "\n")
    sys.stderr.flush()
    return 0


def main(argv: list[str]) -> int:
    grace = 5.0
    if argv[:1] == ["--grace"]:
        grace, argv = float(argv[1]), argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("usage: guard.py [--grace S] -- CMD [ARGS...]", file=sys.stderr)
        return 2
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    _become_subreaper()
    try:
        child = _start(argv)
    except OSError as exc:
        return _report({"returncode": 127, "killed": [], "reason": f"cannot start `{argv[0]}`: {exc}"})
    reason, at_once = _watch(child)
    killed: list[int] = []
    if reason:
        killed = stop_all(0.0 if at_once else grace)
        try:
            child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    elif descendants():  # the command ended: stop anything it left behind (it may hold the output pipe)
        killed = stop_all(min(grace, 1.0))
        reason = "stopped what the command left running after it exited"
    _reap()
    if child.returncode is None:
        child.wait()
    return _report({"returncode": child.returncode, "killed": killed, "reason": reason})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
