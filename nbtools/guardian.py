"""The guardian: parent of every launched command, so that no launch outlives whoever started it
(README, "Runs that leave nothing behind").

``guarded.run_command`` starts this small program in a new session, and it starts the command. It is a
child subreaper (orphans stay its descendants); ``stop`` / ``kill`` on its stdin, its stdin's end (the
starter is gone), or SIGTERM / SIGINT / SIGHUP stop the whole tree; when the command exits it stops what
the command left behind. At exit it writes one JSON line on stderr: ``{"returncode", "killed", "reason"}``.
Run as a script (``python guardian.py [--grace S] -- CMD ...``), importing only the standard library, psutil
and its sibling proctree.py, it starts in tens of milliseconds: psutil and proctree are imported after the
command has started. It sleeps in one select() on its stdin, the command's pidfd (its exit) and the signal wakeup
pipe, so that it notices each at once without polling (Linux < 5.3 has no pidfd: it polls every POLL_S there).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
POLL_S = 0.02  # without a pidfd: how soon the command's exit is noticed (it sets the launch's own overhead)
REAP_S = 0.5  # how often exited orphans are collected


def _proctree():
    """proctree, imported once the command runs (it brings psutil): as a script (always, by nbtools) the sibling
    module; imported as nbtools.guardian, the package's."""
    try:
        from . import proctree
    except ImportError:
        import proctree
    return proctree


_keep: set[int] = set()  # the command itself: Popen reaps it, so that its exit status is not lost


def _reap() -> None:
    """Collect exited orphans that were re-parented to us (not the command: Popen reaps that one)."""
    import psutil

    try:
        children = psutil.Process().children()
    except psutil.Error:
        return
    for p in children:
        if p.pid in _keep:
            continue
        with contextlib.suppress(psutil.Error, ChildProcessError):
            if p.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(p.pid, os.WNOHANG)


def stop_all(grace: float) -> list[int]:
    """Stop every live descendant (nbtools.proctree's one stop loop, new ones included); the pids killed."""
    tree = _proctree()
    killed = tree.terminate_then_kill(tree.descendants, grace, kill_wait=1.0, reap=False)  # Popen reaps the command
    _reap()
    return killed


_requested: list[str] = []


def _on_signal(signum, _frame) -> None:
    _requested.append(f"signal {signal.Signals(signum).name}")


def _read_request(wake: list[int], timeout: float) -> tuple[str, bool] | None:
    """What the starter asked on stdin within ``timeout`` (the command's exit or a signal, ``wake``, ends the wait
    early): (reason, kill at once), or None for nothing."""
    try:
        ready, _, _ = select.select([0, *wake], [], [], timeout)
    except InterruptedError:
        return None
    for fd in set(ready) & set(wake[1:]):  # the signal wakeup pipe: empty it (the handler has run)
        with contextlib.suppress(BlockingIOError):
            os.read(fd, 512)
    if 0 not in ready:
        return None
    data = os.read(0, 64)
    if not data:
        return "the process that started this command is gone (kernel restarted, shut down or killed?)", False
    if b"kill" in data:
        return "kill requested", True
    return ("stop requested", False) if b"stop" in data else None


def _wakers(child: subprocess.Popen) -> list[int]:
    """[the command's pidfd, the signal wakeup pipe]; [] where there is no pidfd (then select polls)."""
    try:
        pidfd = os.pidfd_open(child.pid)
    except (AttributeError, OSError):
        return []
    r, w = os.pipe2(os.O_NONBLOCK)  # pidfd_open and pipe2: Linux
    signal.set_wakeup_fd(w)
    return [pidfd, r]


def _watch(child: subprocess.Popen) -> tuple[str, bool]:
    """Wait for the command to end or for a stop request; ("", False) when the command ended."""
    wake = _wakers(child)
    next_reap = time.monotonic() + REAP_S
    while child.poll() is None:
        if _requested:
            return _requested[0], False
        request = _read_request(wake, max(0.0, next_reap - time.monotonic()) if wake else POLL_S)
        if request is not None:
            return request
        if time.monotonic() >= next_reap:  # orphans that exited: collect them now and then
            _reap()
            next_reap = time.monotonic() + REAP_S
    return "", False


def _report(status: dict) -> int:
    print(json.dumps(status), file=sys.stderr, flush=True)
    return 0


def main(argv: list[str]) -> int:
    grace = None  # not given: proctree.GRACE, the one grace period (imported once the command runs)
    if argv[:1] == ["--grace"]:
        grace, argv = float(argv[1]), argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("usage: guardian.py [--grace S] -- CMD [ARGS...]", file=sys.stderr)
        return 2
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    with contextlib.suppress(OSError, AttributeError):  # a child subreaper (Linux; elsewhere libc has no prctl)
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    try:  # start_new_session: its own process group, so that signals meant for us do not reach it half-way
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=1, stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as exc:
        return _report({"returncode": 127, "killed": [], "reason": f"cannot start `{argv[0]}`: {exc}"})
    _keep.add(child.pid)
    # Drop our own copy of the output pipe: the starter sees end-of-file as soon as the
    # command and its descendants are gone, without waiting for our bookkeeping.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    reason, at_once = _watch(child)
    killed: list[int] = []
    grace = _proctree().GRACE if grace is None else grace
    if reason:
        killed = stop_all(0.0 if at_once else grace)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=5)
    elif _proctree().descendants():  # the command ended: stop anything it left behind (it may hold the output pipe)
        killed = stop_all(min(grace, 1.0))
        reason = "stopped what the command left running after it exited"
    _reap()
    if child.returncode is None:
        child.wait()
    return _report({"returncode": child.returncode, "killed": killed, "reason": reason})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
