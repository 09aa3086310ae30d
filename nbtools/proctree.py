"""Track and stop every process a launch started.

`accelerate launch` (torch elastic underneath) starts each worker in its OWN session
and process group, so killing the launcher's process group leaves the workers
running, orphaned, still holding their devices. We therefore keep a list
of every descendant seen while the launch runs, and stop them all:
SIGTERM to the launcher (its agent ends the workers in ~2 s), a short wait,
then SIGKILL to whatever of the known tree is still alive.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

import psutil

from .checks import LaunchTimeout

# The one grace period between SIGTERM and SIGKILL for everything nbtools stops (a launch's tree,
# a run's kernel, leftovers found by `nbtools ps`): torch elastic's agent ends its workers in ~2 s.
GRACE = 5.0


class ProcessTree:
    """The launcher process and every descendant seen so far."""

    def __init__(self, pid: int):
        self.root_pid = pid
        self.known: dict[int, psutil.Process] = {}
        try:
            self.root = psutil.Process(pid)
            self.known[pid] = self.root
        except psutil.NoSuchProcess:
            self.root = None
        self.refresh()

    def refresh(self) -> None:
        """Remember descendants now: once the launcher dies, orphans can no longer be found from it."""
        if self.root is not None:
            remember(self.root_pid, self.known)

    def alive(self) -> list[psutil.Process]:
        return [proc for proc in self.known.values() if is_alive(proc)]

    def stop(self, grace: float = GRACE) -> list[int]:
        """Stop the whole tree; returns the pids that had to be killed with SIGKILL.

        Only processes still alive are signalled (psutil checks that a pid was not reused), never
        a process group by a number that may since belong to someone else.
        """
        self.refresh()
        if self.root is not None:
            _signal(self.root, signal.SIGTERM)  # the launcher first: its agent ends its workers cleanly
        return terminate_then_kill(self.alive(), grace)

    def leftovers(self) -> list[psutil.Process]:
        """Known descendants (not the launcher) still alive after the launcher ended."""
        return [p for p in self.alive() if p.pid != self.root_pid]


def is_alive(proc: psutil.Process) -> bool:
    """Running and not a zombie; False when it ends between the two questions."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def remember(pid: int, known: dict[int, psutil.Process]) -> None:
    """Add ``pid`` and every descendant alive now to ``known`` (kept there once they are orphaned)."""
    try:
        root = psutil.Process(pid)
        known.setdefault(pid, root)
        for child in root.children(recursive=True):
            known.setdefault(child.pid, child)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass


def signal_group(pid: int, sig: int) -> None:
    """``sig`` to the process group ``pid`` leads (a kernel runs in its own session), else to ``pid``."""
    try:
        os.killpg(os.getpgid(pid), sig)
    except OSError:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def stop_from_top(procs, tops, grace: float = GRACE) -> list[int]:
    """Stop processes whose ``tops`` stop their own trees (guardians): SIGTERM to the tops, up to
    ``grace`` + 3 s for everything to end, then `terminate_then_kill` what is left (no top, or a
    wedged one). Returns the pids still alive afterwards (none, normally)."""
    procs, tops = list(procs), list(tops)
    for top in tops:
        _signal(top, signal.SIGTERM)
    alive = _wait(procs, grace + 3 if tops else 0.1, reap=True)
    terminate_then_kill(alive, grace)
    return [p.pid for p in alive if is_alive(p)]


def kill_now(pid: int) -> None:
    """SIGKILL ``pid`` (a wedged guardian: its tree re-parents to init)."""
    with contextlib.suppress(psutil.Error):
        _signal(psutil.Process(pid), signal.SIGKILL)


def terminate_then_kill(procs, grace: float = GRACE, kill_wait: float = 3.0, reap: bool = True) -> list[int]:
    """SIGTERM ``procs``, wait up to ``grace`` s, SIGKILL the rest; the pids that needed SIGKILL.

    ``reap=False`` waits without reaping: for children whose own parent code (multiprocessing's
    ``join``, torch elastic) must still read their exit codes.
    """
    procs = list(procs)
    for proc in procs:
        _signal(proc, signal.SIGTERM)
    still = _wait(procs, grace, reap)
    killed = [p.pid for p in still if _signal(p, signal.SIGKILL)]
    _wait(still, kill_wait, reap)
    return killed


def _wait(procs: list[psutil.Process], timeout: float, reap: bool) -> list[psutil.Process]:
    """The processes still alive after up to ``timeout`` s."""
    if reap:
        return psutil.wait_procs(procs, timeout=timeout)[1]
    deadline = time.monotonic() + timeout
    while (alive := [p for p in procs if is_alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def _signal(proc: psutil.Process, sig: int) -> bool:
    try:
        proc.send_signal(sig)
        return True
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


@contextlib.contextmanager
def time_limit(seconds: float, what: str, grace: float = 15.0):
    """Bound a call that runs child processes INSIDE this process (``notebook_launcher`` forks the kernel).

    A ``%launch`` is bounded by its guardian; an in-kernel call has none. After ``seconds`` the
    processes the call started (children of this process that were not there before) are stopped,
    which makes torch elastic's agent raise; if the call still has not returned ``grace`` s later,
    the main thread is interrupted. Either way the block ends with a ``LaunchTimeout`` naming
    ``what``, the limit and the pids that were stopped, instead of a cell that hangs for good.
    """
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    fired = threading.Event()
    done = threading.Event()
    stopped: list[int] = []

    def expire() -> None:
        if done.is_set():
            return
        fired.set()
        new = [p for p in me.children(recursive=True) if p.pid not in before]
        stopped.extend(p.pid for p in new)
        terminate_then_kill(new, grace=3.0, kill_wait=1.0, reap=False)
        if not done.wait(grace):
            os.kill(os.getpid(), signal.SIGINT)  # wakes a blocking wait; KeyboardInterrupt in the main thread

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    with _interruptible():
        timer.start()
        try:
            yield
        except BaseException as exc:
            if not fired.is_set():
                raise
            raise LaunchTimeout(_expired(what, seconds, stopped)) from exc
        finally:
            done.set()
            timer.cancel()
    if fired.is_set():
        raise LaunchTimeout(_expired(what, seconds, stopped))


@contextlib.contextmanager
def _interruptible():
    """SIGINT raises KeyboardInterrupt in the main thread meanwhile, even where it was ignored on entry
    (a job started with `&` from a script inherits SIGINT ignored) or left to the system (which would end
    the process)."""
    before = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or before not in (signal.SIG_IGN, signal.SIG_DFL):
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def _expired(what: str, seconds: float, stopped: list[int]) -> str:
    pids = ", ".join(map(str, stopped)) or "none"
    return (
        f"{what} did not finish within {seconds:g} s (timeout_s); the processes it started were stopped "
        f"(pids {pids}). A rank that never reaches the rendezvous, or one forked while another thread of the "
        "kernel held a lock, waits forever; run the cell again, and if it hangs again restart the kernel "
        "(Kernel > Restart) and run the notebook from the top."
    )
