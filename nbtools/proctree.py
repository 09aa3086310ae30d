"""Find and stop processes: the one walker and the one stop loop of nbtools (see README, "Layout").

`accelerate launch` (torch elastic underneath) starts each worker in its OWN session and process
group, so killing a process group leaves workers running, still holding their devices. Processes are
therefore found by walking trees (``descendants``, ``remember``) or by the marker variable every
process of a launch inherits (``marked``), and stopped with one loop: SIGTERM, a grace period, SIGKILL
(``terminate_then_kill``); the runner's ``Stopper`` turns Ctrl-C, SIGTERM and SIGHUP into a stop of the running
kernel's tree. It imports only psutil and the standard library: the guardian (guardian.py),
which must start in milliseconds, imports it as a sibling module.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

import psutil

# The one grace period between SIGTERM and SIGKILL for everything nbtools stops (a launch's tree,
# a run's kernel, leftovers found by `nbtools ps`): torch elastic's agent ends its workers in ~2 s.
GRACE = 5.0
STOP_GRACE_S = 4.0  # after a stop signal: time for a runner's interrupted cell to stop its launches
SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))


def is_alive(proc: psutil.Process) -> bool:
    """Running and not a zombie; False when it ends between the two questions."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def descendants(pid: int | None = None) -> list[psutil.Process]:
    """Live descendants (zombies excluded) of ``pid``, default this process."""
    try:
        return [p for p in psutil.Process(pid).children(recursive=True) if is_alive(p)]
    except psutil.Error:
        return []


def marked(name: str, value=None, within: int | None = None) -> list[psutil.Process]:
    """Live processes whose environment holds ``name`` (equal to ``value``, or ``value(v)`` true when it is a
    function): the descendants of ``within``, or every process of this user when it is None."""
    procs = psutil.process_iter() if within is None else descendants(within)
    found = []
    for proc in procs:
        try:
            v = proc.environ().get(name) if proc.pid != os.getpid() and is_alive(proc) else None
        except (psutil.Error, OSError):
            continue  # another user's process, or gone
        if v is not None and (value is None or (value(v) if callable(value) else v == value)):
            found.append(proc)
    return found


def existing(pids) -> list[psutil.Process]:
    """The processes of ``pids`` that still exist."""
    found = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            found.append(psutil.Process(pid))
    return found


def tops(procs) -> list[psutil.Process]:
    """Those of ``procs`` whose parent is not among them (a launch's guardian, above its tree)."""
    pids = {p.pid for p in procs}
    found = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            if proc.ppid() not in pids:
                found.append(proc)
    return found


def remember(pid: int, known: dict[int, psutil.Process]) -> None:
    """Add ``pid`` and every descendant alive now to ``known`` (kept there once they are orphaned)."""
    with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
        root = psutil.Process(pid)
        known.setdefault(pid, root)
        for child in root.children(recursive=True):
            known.setdefault(child.pid, child)


def stop_from_top(procs, tops) -> list[int]:
    """Stop processes whose ``tops`` stop their own trees (guardians): SIGTERM to the tops, up to
    GRACE + 3 s for everything to end, then `terminate_then_kill` what is left (no top, or a
    wedged one). Returns the pids still alive afterwards (none, normally)."""
    procs, tops = list(procs), list(tops)
    for top in tops:
        _signal(top, signal.SIGTERM)
    alive = _wait(procs, GRACE + 3 if tops else 0.1, reap=True)
    terminate_then_kill(alive)
    return [p.pid for p in alive if is_alive(p)]


def kill_now(pid: int) -> None:
    """SIGKILL ``pid`` (a wedged guardian: its tree re-parents to init)."""
    with contextlib.suppress(psutil.Error):
        _signal(psutil.Process(pid), signal.SIGKILL)


def terminate_then_kill(procs, grace: float | None = None, kill_wait: float = 3.0, reap: bool = True) -> list[int]:
    """SIGTERM ``procs``, wait up to ``grace`` s, SIGKILL the rest; the pids that needed SIGKILL.

    ``procs`` is a list, or a function that lists them again (the guardian's ``descendants``): then what
    appears while they stop (an agent restarting a worker, a fork) is signalled too. ``reap=False`` waits
    without reaping: for children whose own parent code (multiprocessing's ``join``, torch elastic) must
    still read their exit codes.
    """
    fixed = None if callable(procs) else list(procs)
    listing = procs if fixed is None else (lambda: [p for p in fixed if is_alive(p)])
    deadline = time.monotonic() + (GRACE if grace is None else grace)
    signalled: set[int] = set()
    empty = 0  # a listing function: nothing alive twice in a row, 50 ms apart (a re-parented orphan may lag)
    while (live := listing()) or (fixed is None and empty < 2):
        empty = 0 if live else empty + 1
        for proc in live:
            if proc.pid not in signalled and _signal(proc, signal.SIGTERM):
                signalled.add(proc.pid)
        if time.monotonic() >= deadline:
            break
        if live:
            _wait(live, max(0.0, min(0.1, deadline - time.monotonic())), reap)  # the clock moves on between reads
        else:
            time.sleep(0.05)
    killed: list[int] = []
    for _ in range(5 if fixed is None else 1):  # a process may fork while it is being killed
        live = listing()
        killed += [p.pid for p in live if _signal(p, signal.SIGKILL)]
        _wait(live, kill_wait if live else 0, reap)
    return sorted(set(killed))


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
    from .errors import LaunchTimeout  # here, not at the top: the guardian imports this module alone

    before = {p.pid for p in descendants()}
    fired = threading.Event()
    done = threading.Event()
    stopped: list[int] = []

    def expire() -> None:
        if done.is_set():
            return
        fired.set()
        new = [p for p in descendants() if p.pid not in before]
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


class Stopper:
    """Ctrl-C, SIGTERM and SIGHUP while notebooks run; a context manager around the whole run.

    The first signal interrupts the running kernel (SIGINT to its process group, as JupyterLab's
    stop button does: the cell's launch stops its processes and the cell fails), lets no further
    cell start, and gives it STOP_GRACE_S; then the kernel's process group is killed. A second
    signal kills at once. At the end, whatever the kernel had started and is still alive gets
    SIGTERM, then SIGKILL (GRACE apart). The run then reports what it did and the CLI exits 128 + signal.
    """

    def __init__(self):
        self.signum: int | None = None
        self.state = None  # the running notebook's kernels.KernelState: its .pid, and .stopping set on a stop
        self.known: dict[int, object] = {}  # pid -> psutil.Process: the kernel and its descendants
        self._saved: dict[int, object] = {}
        self._done = threading.Event()
        self._lock = threading.RLock()  # the signal handler may run while the main thread holds it

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    def __enter__(self) -> Stopper:
        if threading.current_thread() is threading.main_thread():  # signal handlers can only be set from there
            self._saved = {sig: signal.signal(sig, self._on_signal) for sig in SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        """Stop watching; SIGTERM then SIGKILL whatever the stopped kernel left alive, saying so."""
        self._done.set()
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)
        if self.signum is not None and (left := [p for p in self.known.values() if is_alive(p)]):
            terminate_then_kill(left)
            self._say(f"nbtools run: stopped {len(left)} process(es) the kernel had left: {[p.pid for p in left]}")

    def _say(self, text: str) -> None:
        with contextlib.suppress(OSError, ValueError):  # SIGHUP: the terminal may be gone
            print(text)

    def _on_signal(self, signum, frame) -> None:
        if self.signum is not None:
            self._say(f"nbtools run: {signal.Signals(signum).name} again: killing the kernel now")
            self._signal_kernel(signal.SIGKILL)
            return
        self.signum = signum
        self._say(f"\nnbtools run: {self.name} received: stopping the running notebook (its launches stop with it), "
                  "then writing the report")
        if (state := self.state) is not None:
            state.stopping = True
        self._signal_kernel(signal.SIGINT)  # notes the kernel's tree first
        threading.Thread(target=self._watch, daemon=True, name="nbtools-stop").start()

    def _watch(self) -> None:
        deadline = time.monotonic() + STOP_GRACE_S
        while not self._done.wait(0.2):
            self._remember()
            if time.monotonic() > deadline and self.state is not None:
                self._say(f"nbtools run: the kernel did not stop within {STOP_GRACE_S:.0f} s: killing it")
                self._signal_kernel(signal.SIGKILL)
                deadline = float("inf")

    def _remember(self) -> int | None:
        """Note the kernel and its descendants now: once the kernel is gone they cannot be found from it. Its pid."""
        pid = self.state.pid if self.state is not None else None
        if pid is not None:
            with self._lock:
                remember(pid, self.known)
        return pid

    def _signal_kernel(self, sig: int) -> None:
        if (pid := self._remember()) is None:  # noted first: a kernel killed takes its tree's links with it
            return
        try:
            os.killpg(os.getpgid(pid), sig)  # the kernel runs in its own session: its process group
        except OSError:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)

    @contextlib.contextmanager
    def watching(self, state):
        """While the block runs, a stop signal is for ``state``'s kernel."""
        self.state = state
        if self.signum is not None:
            state.stopping = True
        try:
            yield state
        finally:
            self._remember()
            self.state = None
