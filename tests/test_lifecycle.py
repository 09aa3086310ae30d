"""No launch outlives its kernel or its command: every way a launch can be abandoned, with real processes.

Each case starts a real 2-rank `accelerate launch` (through nbtools) whose ranks are QUIET (they
sleep after saying they are ready, so no closed output pipe kills them), abandons it one way, and
checks the process table: nothing that mentions the launch's unique script path may remain 10 s later.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from conftest import processes_mentioning, wait_gone

import nbtools
import nbtools.ps
from nbtools import decide

QUIET_RANKS = textwrap.dedent(
    """
    import os, sys, time
    from accelerate import Accelerator

    acc = Accelerator()
    open(os.path.join(os.path.dirname(os.path.abspath(__file__)), f"ready{acc.process_index}"), "w").close()
    time.sleep(900)
    """
)
GONE_WITHIN_S = 10.0


def _quiet_script(tmp_path: Path) -> Path:
    script = tmp_path / "quiet_ranks.py"
    script.write_text(QUIET_RANKS)
    return script


def _expected_ranks() -> int:
    return decide.plan(nbtools.detect(), 2).num_processes


def _wait_ready(script: Path, timeout: float = 120.0) -> list[psutil.Process]:
    """Wait until every rank wrote its ready file; return the launch's processes at that moment."""
    n = _expected_ranks()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all((script.parent / f"ready{i}").exists() for i in range(n)):
            procs = processes_mentioning(str(script))
            assert len(procs) >= 1 + n, [p.cmdline() for p in procs]
            return procs
        time.sleep(0.2)
    raise AssertionError(f"the ranks never got ready; processes: {[p.cmdline() for p in processes_mentioning(str(script))]}")


def _assert_all_gone(script: Path) -> None:
    left = wait_gone(str(script), GONE_WITHIN_S)
    for p in left:  # do not leak into later tests, but fail this one
        try:
            p.kill()
        except psutil.Error:
            pass
    assert not left, f"still running {GONE_WITHIN_S:.0f} s later: {[(p.pid, p.cmdline()) for p in left]}"


# --------------------------------------------------------------------------- kernel cases
import jupyter_client  # noqa: E402  (a dependency of papermill: always here)


@pytest.fixture
def kernel():
    km = jupyter_client.KernelManager(kernel_name="python3")
    km.start_kernel(env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    yield km, kc
    kc.stop_channels()
    if km.is_alive():
        km.shutdown_kernel(now=True)


def _launch_in_kernel(kc, script: Path) -> None:
    kc.execute(f"import nbtools\nnbtools.accelerate_launch({str(script)!r}, num_processes=2, timeout=900)")


@pytest.mark.parametrize("how", ["restart", "shutdown", "sigkill"])
def test_kernel_gone_mid_launch_leaves_nothing(kernel, tmp_path, how):
    km, kc = kernel
    script = _quiet_script(tmp_path)
    _launch_in_kernel(kc, script)
    _wait_ready(script)
    if how == "restart":
        km.restart_kernel()  # JupyterLab's "Restart Kernel"
    elif how == "shutdown":
        km.shutdown_kernel()  # JupyterLab's "Shut Down Kernel"
    else:
        os.kill(km.provisioner.process.pid, signal.SIGKILL)
    _assert_all_gone(script)


# --------------------------------------------------------------------------- command-line cases
def _start_cli_launch(script: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "nbtools", "launch", "--timeout", "900", str(script)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL])
def test_signal_to_nbtools_launch_leaves_nothing(tmp_path, sig):
    script = _quiet_script(tmp_path)
    cli = _start_cli_launch(script)
    try:
        _wait_ready(script)
        cli.send_signal(sig)
        cli.wait(timeout=GONE_WITHIN_S + 5)
        _assert_all_gone(script)
    finally:
        if cli.poll() is None:
            cli.kill()


def test_second_ctrl_c_while_stopping_leaves_nothing(tmp_path):
    script = _quiet_script(tmp_path)
    cli = _start_cli_launch(script)
    try:
        _wait_ready(script)
        cli.send_signal(signal.SIGINT)
        time.sleep(0.3)  # the first stop is under way
        cli.send_signal(signal.SIGINT)
        cli.wait(timeout=GONE_WITHIN_S + 5)
        _assert_all_gone(script)
    finally:
        if cli.poll() is None:
            cli.kill()


def test_exception_in_output_loop_leaves_nothing(tmp_path, monkeypatch):
    """The cell's output stream breaks mid-launch: the launch is stopped, the error propagates."""
    script = tmp_path / "chatty.py"
    script.write_text("import time\nfor i in range(1000):\n    print('line', i, flush=True)\n    time.sleep(0.05)\n")

    class Broken:
        def __init__(self):
            self.n = 0

        def write(self, text):
            self.n += 1
            if self.n > 3:
                raise OSError("the notebook's output went away")

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stdout", Broken())
    with pytest.raises(OSError, match="output went away"):
        nbtools.run_command([sys.executable, str(script)], timeout=120)
    monkeypatch.undo()
    _assert_all_gone(script)


def test_descendant_holding_the_pipe_does_not_delay_the_return():
    seconds = str(900 + os.getpid() % 97)  # a command line unique to this test

    def sleepers():
        return [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", seconds]]

    start = time.monotonic()
    result = nbtools.run_command(["bash", "-c", f"sleep {seconds} & echo hi"], timeout=300)
    took = time.monotonic() - start
    assert result.returncode == 0 and "hi" in result.output
    assert took < 5, f"returned after {took:.1f} s: it waited for the descendant holding the output pipe"
    assert not sleepers(), "the descendant is still running"


# --------------------------------------------------------------------------- leftovers from earlier runs
def test_ps_lists_a_leftover_launch_and_kill_stops_it(kernel, tmp_path):
    """A kernel wedged mid-launch (alive, so its launch goes on): `nbtools ps` shows it, `--kill` ends it."""
    km, kc = kernel
    script = _quiet_script(tmp_path)
    _launch_in_kernel(kc, script)
    procs = _wait_ready(script)
    listing = subprocess.run([sys.executable, "-m", "nbtools", "ps"], capture_output=True, text=True, timeout=60)
    assert listing.returncode == 0, listing.stderr
    for p in procs:
        assert str(p.pid) in listing.stdout, (p.pid, listing.stdout)
    assert "guardian" in listing.stdout and "still running" in listing.stdout
    # Stop only this test's launch (other launches on this machine are not ours to kill), by one of its pids.
    ours = [g for g in nbtools.ps.find() if {p.pid for p in g.processes} & {p.pid for p in procs}]
    assert len(ours) == 1 and ours[0].starter_alive
    # Naming a launch selects it alone; another id lists nothing.
    only = subprocess.run([sys.executable, "-m", "nbtools", "ps", ours[0].id], capture_output=True, text=True, timeout=60)
    assert f"launch {ours[0].id}: started by pid" in only.stdout and "1 launch(es) still running" in only.stdout, only.stdout
    other = subprocess.run([sys.executable, "-m", "nbtools", "ps", f"not-{ours[0].id}"], capture_output=True, text=True, timeout=60)
    assert "no launch started by nbtools is running" in other.stdout, other.stdout
    stopped = subprocess.run(
        [sys.executable, "-m", "nbtools", "ps", "--kill", str(procs[-1].pid)], capture_output=True, text=True, timeout=60
    )
    assert stopped.returncode == 0 and "stopped" in stopped.stdout, stopped.stdout + stopped.stderr
    _assert_all_gone(script)
    after = subprocess.run([sys.executable, "-m", "nbtools", "ps"], capture_output=True, text=True, timeout=60)
    assert ours[0].id not in after.stdout, after.stdout


# --------------------------------------------------------------------------- in-kernel forks
FORK_WHILE_LOCKED = textwrap.dedent(
    """
    import os, sys, threading, time
    stop = threading.Event()
    def hold():  # what ipykernel's IOPub thread does for an instant at every flush, held for long
        while not stop.is_set():
            with sys.stdout._buffer_lock:
                time.sleep(0.05)
            time.sleep(0.001)
    threading.Thread(target=hold, daemon=True).start()
    time.sleep(0.2)
    pid = os.fork()
    if pid == 0:  # a rank of notebook_launcher: prints, and flushes as every multiprocessing child does
        print("child printed", flush=True)
        os._exit(0)
    t0 = time.monotonic()
    while not (done := os.waitpid(pid, os.WNOHANG)[0]) and time.monotonic() - t0 < 10:
        time.sleep(0.1)
    stop.set()
    if not done:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    print("fork:", "exited" if done else "hung")
    """
)


def _run_cell(kc, code: str, timeout: float = 60) -> str:
    out: list[str] = []

    def hook(msg):
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append("\n".join(msg["content"]["traceback"]))

    kc.execute_interactive(code, output_hook=hook, timeout=timeout)
    return "".join(out)


def test_fork_from_the_kernel_does_not_inherit_a_held_output_lock(kernel):
    """notebook_launcher forks the kernel; %load_ext nbtools makes the ranks' output safe to use."""
    _, kc = kernel
    control = _run_cell(kc, FORK_WHILE_LOCKED)
    if "fork: exited" in control:
        pytest.skip("this ipykernel no longer hands a forked child a held output lock; nbtools' reset is moot")
    assert "fork: hung" in control, control  # the hazard is real here: the reset below is what fixes it
    fixed = _run_cell(kc, "import nbtools\n%load_ext nbtools\n" + FORK_WHILE_LOCKED)
    assert "fork: exited" in fixed and "child printed" in fixed, fixed


def test_time_limit_stops_the_forked_ranks_of_a_hung_call():
    import multiprocessing

    from nbtools.proctree import time_limit

    ctx = multiprocessing.get_context("fork")
    rank = ctx.Process(target=time.sleep, args=(600,))
    t0 = time.monotonic()
    with pytest.raises(nbtools.LaunchTimeout, match=r"hung_call did not finish within 2 s .*pids \d+") as err:
        with time_limit(2, "hung_call", grace=5):
            rank.start()
            rank.join()  # torch elastic's agent waits on its workers like this
            if rank.exitcode != 0:
                raise RuntimeError(f"worker failed with {rank.exitcode}")  # the agent's ChildFailedError
    assert str(rank.pid) in str(err.value)
    assert time.monotonic() - t0 < 10
    assert not rank.is_alive()


@pytest.mark.parametrize("sigint_on_entry", ["python's handler", "ignored"])
def test_time_limit_interrupts_a_call_that_ignores_its_stopped_ranks(sigint_on_entry):
    """The main thread is interrupted after limit + grace (2 s by design), even in a process that inherited
    SIGINT ignored (a script's background job): the failure this catches is waiting out the whole sleep."""
    from nbtools.proctree import time_limit

    stuck_s, limit, grace = 60, 1, 1
    before = signal.signal(signal.SIGINT, signal.SIG_IGN if sigint_on_entry == "ignored" else signal.default_int_handler)
    try:
        t0 = time.monotonic()
        with pytest.raises(nbtools.LaunchTimeout, match=r"stuck did not finish within 1 s .*pids none"):
            with time_limit(limit, "stuck", grace=grace):
                time.sleep(stuck_s)  # waiting on something that is not a child process
        took = time.monotonic() - t0
        assert signal.getsignal(signal.SIGINT) == (signal.SIG_IGN if sigint_on_entry == "ignored" else signal.default_int_handler)
    finally:
        signal.signal(signal.SIGINT, before)
    assert limit + grace <= took < stuck_s / 2, took


def test_time_limit_passes_a_call_that_ends_in_time():
    from nbtools.proctree import time_limit

    with time_limit(0.5, "quick"):
        x = 1
    assert x == 1
    time.sleep(1.0)  # the cancelled timer never fires into later code


# --------------------------------------------------------------------------- %launch --background
def _background_in_kernel(kc, script: Path) -> str:
    return _run_cell(
        kc,
        "import nbtools\n%load_ext nbtools\n"
        f"S = nbtools.setup(num_processes=2, work_dir={str(script.parent)!r}, keep_work_dir=True)\n"
        f"bg = %launch --background accelerate launch --num_processes 2 {script}\n"
        "print('returned:', type(bg).__name__, bg.running())",
    )


@pytest.mark.parametrize("how", ["close", "restart"])
def test_background_launch_is_stopped_by_close_or_restart(kernel, tmp_path, how):
    km, kc = kernel
    script = _quiet_script(tmp_path)
    out = _background_in_kernel(kc, script)
    assert "returned: Background True" in out, out
    assert f"{script} > quiet_ranks.log 2>&1 &" in out, out  # the printed line runs as printed, in background
    _wait_ready(script)
    if how == "close":
        closed = _run_cell(kc, "import os\nS.close()\nprint('exit code:', bg.returncode, '| tmp left:', os.path.exists(bg._tmp))")
        assert "停止了一个仍在运行的后台启动" in closed and "exit code: None" not in closed, closed
        assert "tmp left: False" in closed, closed  # S.close() tidied the launch, not only stopped it
    else:
        km.restart_kernel()
    _assert_all_gone(script)


def test_background_is_a_launch_option_only():
    from nbtools.magics import run_written

    with pytest.raises(nbtools.ParameterError, match="--background and --fit are %launch options"):
        run_written("--background python -c pass")


def test_background_can_be_asked_again_once_it_ended(tmp_path, monkeypatch):
    """wait(), stop() and repr after the end read the one status the guardian wrote, not a closed pipe."""
    from nbtools.guarded import start_background

    monkeypatch.chdir(tmp_path)
    bg = start_background([sys.executable, "-c", "print('hi')"], cwd=tmp_path, echo=False)
    assert bg.wait(timeout=60) == 0 and bg.wait() == 0 and bg.stop() == 0
    assert "exit 0" in repr(bg) and "hi" in bg.output
