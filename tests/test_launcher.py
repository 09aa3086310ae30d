"""The launcher with real processes: a real 2-rank gloo group, a crashing rank, a hanging
rank, a busy port 29500, error markers, and interrupts. No mocks."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest
from conftest import processes_mentioning, wait_gone

import nbtools
from nbtools import LaunchError, LaunchTimeout

WORKER = textwrap.dedent(
    """
    import sys, time, torch
    from accelerate import Accelerator
    acc = Accelerator()
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    x = torch.tensor([1, 2, 3], device=acc.device)
    g = acc.gather_for_metrics(x)
    acc.print(f"world={acc.num_processes} distributed_type={acc.distributed_type.name} backend={acc.state.backend}")
    acc.print(f"gathered={g.tolist()}")
    if mode == "crash" and acc.process_index == 1:
        raise RuntimeError("boom on rank 1")
    if mode == "hang":
        if acc.process_index == 0:
            time.sleep(600)  # rank 1 waits for it in a collective forever
        acc.wait_for_everyone()
    acc.end_training()  # destroys the process group: without it gloo may abort at exit
    """
)


@pytest.fixture
def worker(tmp_path):
    path = tmp_path / "worker_under_test.py"
    path.write_text(WORKER)
    return path


def test_cli_launch_gives_a_real_two_rank_group(worker, python):
    proc = subprocess.run(
        [python, "-m", "nbtools", "launch", "--num-processes", "2", "--timeout", "180", str(worker)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    kv = nbtools.parse_kv(proc.stdout)
    assert kv["world"] == "2" and kv["distributed_type"] == "MULTI_CPU" and kv["backend"] == "gloo"
    assert kv["gathered"] == "[1, 2, 3, 1, 2, 3]"
    # the exact command a learner would type, env prefix included
    assert "$ ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2" in proc.stdout
    assert "--main_process_port" in proc.stdout


def test_a_crashing_rank_fails_fast_with_its_traceback_and_leaves_nothing(worker):
    start = time.monotonic()
    with pytest.raises(LaunchError) as err:
        nbtools.accelerate_launch(worker, "crash", num_processes=2, timeout=180, echo=False)
    assert time.monotonic() - start < 60
    msg = str(err.value)
    assert "Rank 1 failed first" in msg and "RuntimeError: boom on rank 1" in msg
    assert err.value.result.returncode != 0
    assert wait_gone(str(worker)) == []


def test_a_hanging_rank_is_stopped_at_the_timeout_and_leaves_nothing(worker):
    start = time.monotonic()
    with pytest.raises(LaunchTimeout) as err:
        nbtools.accelerate_launch(worker, "hang", num_processes=2, timeout=20, timeout_name="timeout_s", echo=False)
    elapsed = time.monotonic() - start
    assert 20 <= elapsed < 45
    assert "timeout_s=20 s" in str(err.value)
    assert wait_gone(str(worker)) == []


def test_port_29500_held_elsewhere_does_not_break_a_launch(worker, tmp_path, monkeypatch):
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        holder.bind(("0.0.0.0", 29500))
        holder.listen(1)
    except OSError:
        pytest.skip("port 29500 is already in use on this machine (which is what this test simulates)")
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    try:
        result = nbtools.accelerate_launch(worker, num_processes=2, timeout=180, echo=False)
    finally:
        holder.close()
    assert result.port != 29500
    assert result.kv["world"] == "2"
    # torch elastic's torchelastic_* folders went into the launch's private TMPDIR, now removed
    assert list(temp.iterdir()) == []


def test_non_zero_exit_raises_with_the_last_lines(python):
    with pytest.raises(LaunchError, match=r"(?s)exit code 3.*Last lines of the output:\n\s+bye"):
        nbtools.run([python, "-c", "print('bye'); raise SystemExit(3)"], echo=False)


def test_an_error_marker_fails_even_with_exit_code_0(python):
    code = "print('[ERROR] 2026-11-30 HCCL init failed ERR99999')"
    with pytest.raises(LaunchError, match="exited 0 but its output holds the error marker"):
        nbtools.run([python, "-c", code], echo=False)
    assert nbtools.run([python, "-c", code], echo=False, check=False).returncode == 0


def test_output_streams_while_the_command_runs(python, tmp_path, capsys):
    code = "import time\nprint('first', flush=False)\ntime.sleep(2)\nprint('second')"
    stamps = []

    class Spy:
        def write(self, s):
            stamps.append((time.monotonic(), s))

        def flush(self):
            pass

    old, sys.stdout = sys.stdout, Spy()
    try:
        nbtools.run([python, "-c", code])
    finally:
        sys.stdout = old
    t_first = next(t for t, s in stamps if s == "first\n")
    t_second = next(t for t, s in stamps if s == "second\n")
    assert t_second - t_first > 1.5  # 'first' arrived before the child ended (PYTHONUNBUFFERED)


def test_hugging_face_is_kept_offline_unless_asked(python):
    code = "import os; print('offline=' + os.environ.get('HF_HUB_OFFLINE', 'unset'))"
    assert nbtools.run([python, "-c", code], echo=False).kv["offline"] == "1"
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    os_environ = os.environ.copy()
    try:
        os.environ.clear()
        os.environ.update(env)
        assert nbtools.run([python, "-c", code], echo=False, offline=False).kv["offline"] == "unset"
    finally:
        os.environ.clear()
        os.environ.update(os_environ)


def test_interrupt_stops_every_child(python, tmp_path):
    """SIGINT to a kernel-like process running nbtools.run (what JupyterLab's stop button sends)."""
    marker = tmp_path / "grandchild_marker.py"
    marker.write_text("import time\ntime.sleep(600)\n")
    # the child starts two grandchildren in their own sessions, like torch elastic does
    spawner = tmp_path / "spawner.py"
    spawner.write_text(
        textwrap.dedent(
            f"""
            import subprocess, sys, time
            for _ in range(2):
                subprocess.Popen([sys.executable, {str(marker)!r}], start_new_session=True)
            print('spawned', flush=True)
            time.sleep(600)
            """
        )
    )
    driver = tmp_path / "driver.py"
    driver.write_text(
        textwrap.dedent(
            f"""
            import sys, nbtools
            try:
                nbtools.run([sys.executable, {str(spawner)!r}], timeout=300)
            except KeyboardInterrupt:
                print('driver saw KeyboardInterrupt', flush=True)
                sys.exit(0)
            """
        )
    )
    proc = subprocess.Popen([python, str(driver)], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(processes_mentioning(str(marker))) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(processes_mentioning(str(marker))) == 2
    time.sleep(0.5)  # let the launcher's tree refresh see them
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert "interrupted: stopped" in out and "driver saw KeyboardInterrupt" in out
    assert wait_gone(str(marker)) == []
    assert wait_gone(str(spawner)) == []


def test_a_gloo_teardown_abort_after_the_work_is_retried_once_visibly(tmp_path, capsys):
    """torch's gloo sometimes aborts a rank at exit ('terminate called without an active exception')
    after all its work, even with end_training(). The launcher reruns the launch once, saying so;
    a second abort fails as usual."""
    marker = tmp_path / "attempts"
    script = tmp_path / "aborts_once.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import os, pathlib, sys
            m = pathlib.Path({str(marker)!r})
            n = int(m.read_text()) + 1 if m.exists() else 1
            m.write_text(str(n))
            print(f"attempt={{n}}", flush=True)
            if n <= {{limit}}:
                sys.stderr.write("terminate called without an active exception\\n")
                sys.stderr.flush()
                os.abort()
            """
        )
    )
    src = script.read_text()
    script.write_text(src.replace("{limit}", "1"))
    result = nbtools.accelerate_launch(script, num_processes=1, timeout=120)
    assert result.kv["attempt"] == "2" and "attempt=1" not in result.output
    assert "running the whole launch again once" in capsys.readouterr().out
    marker.unlink()
    script.write_text(src.replace("{limit}", "2"))
    with pytest.raises(LaunchError, match="gloo aborts at exit"):
        nbtools.accelerate_launch(script, num_processes=1, timeout=120, echo=False)
    assert marker.read_text() == "2"
