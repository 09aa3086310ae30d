"""The launcher with real processes: a real 2-rank gloo group, a crashing rank, a hanging
rank, a busy port 29500, error markers, and interrupts. No mocks."""

from __future__ import annotations

import dataclasses
import os
import re
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
from nbtools import LaunchError, LaunchTimeout, decide, diagnose, guarded
from nbtools.diagnose import unglue_warning
from nbtools.guarded import LaunchOptions

WORKER = textwrap.dedent(
    """
    import os, sys, time, torch
    from accelerate import Accelerator
    acc = Accelerator()
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    x = torch.tensor([1, 2, 3], device=acc.device)
    g = acc.gather_for_metrics(x)
    acc.print(f"world={acc.num_processes} distributed_type={acc.distributed_type.name} backend={acc.state.backend}")
    acc.print(f"gathered={g.tolist()}")
    acc.print(f"debug_mode={os.environ.get('ACCELERATE_DEBUG_MODE', 'unset')}")
    acc.print("visible=" + (os.environ.get("ASCEND_RT_VISIBLE_DEVICES") or os.environ.get("CUDA_VISIBLE_DEVICES") or "unset"))
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
        nbtools.accelerate_launch(worker, "crash", num_processes=2, timeout=180, options=LaunchOptions(echo=False))
    assert time.monotonic() - start < 60
    msg = str(err.value)
    assert "Rank 1 failed first" in msg and "RuntimeError: boom on rank 1" in msg
    assert msg.splitlines()[0].endswith("-- rank 1: RuntimeError: boom on rank 1")  # the reason a report shows
    assert err.value.result.returncode != 0
    assert (err.value.rank, err.value.line) == (1, "RuntimeError: boom on rank 1")  # as fields, read by diagnose
    assert err.value.result.plan.num_processes == 2 and err.value.result.port  # the result built once, with its launch
    assert wait_gone(str(worker)) == []


def test_a_failure_read_from_output_carries_its_rank_and_line():
    """The fields come from where the output is read, once (diagnose.judged), without running anything."""
    from nbtools.diagnose import judged

    out = "[rank0]: ok\n[rank1]: Traceback (most recent call last):\n[rank1]:   File \"w.py\"\n[rank1]: ValueError: bad x\n"
    error = judged("c", ["c"], 1, out, 0.1).error
    assert isinstance(error, LaunchError) and (error.rank, error.line) == (1, "ValueError: bad x")
    error = judged("c", ["c"], 2, "no ranks here\n", 0.1).error
    assert isinstance(error, LaunchError) and (error.rank, error.line) == (None, None)
    assert judged("c", ["c"], 0, "fine\n", 0.1).error is None


def test_a_hanging_rank_is_stopped_at_the_timeout_and_leaves_nothing(worker):
    start = time.monotonic()
    with pytest.raises(LaunchTimeout) as err:
        nbtools.accelerate_launch(worker, "hang", num_processes=2, timeout=10, options=LaunchOptions(echo=False))
    elapsed = time.monotonic() - start
    assert 10 <= elapsed < 35
    assert "timeout_s=10 s" in str(err.value)
    assert wait_gone(str(worker)) == []


def test_a_taken_rendezvous_port_is_retried_on_another(worker, tmp_path, monkeypatch, capsys):
    """The port the launcher picked is taken before the launch binds it: it must retry elsewhere.

    The race is forced: the first "free" port handed out is one this test has bound (without
    listening, so the rendezvous fails at once with EADDRINUSE)."""
    holder = socket.socket()
    holder.bind(("0.0.0.0", 0))
    taken = holder.getsockname()[1]
    real_free_port = guarded.free_port
    handed = []

    def racy_free_port(host="127.0.0.1"):
        port = taken if not handed else real_free_port(host)
        handed.append(port)
        return port

    monkeypatch.setattr(guarded, "free_port", racy_free_port)
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    plan = decide.plan(nbtools.detect(), 2)
    try:
        result = nbtools.accelerate_launch(worker, num_processes=2, timeout=180)
    finally:
        holder.close()
    assert handed[0] == taken and result.port == handed[-1] != taken, (handed, result.port)
    assert f"port {taken} was taken meanwhile" in capsys.readouterr().out
    assert result.kv["world"] == str(plan.num_processes)
    assert result.kv["distributed_type"] == plan.distributed_type
    # torch elastic's torchelastic_* folders went into the launch's private TMPDIR, now removed
    assert list(temp.iterdir()) == []


def test_the_users_accelerate_config_and_variables_do_not_leak_in(worker, tmp_path, monkeypatch):
    """What `accelerate config` writes (DeepSpeed, fp16, 8 processes, gpu_ids) must not change a launch."""
    home = tmp_path / "hf_home"
    (home / "accelerate").mkdir(parents=True)
    (home / "accelerate" / "default_config.yaml").write_text(
        textwrap.dedent(
            """
            compute_environment: LOCAL_MACHINE
            distributed_type: DEEPSPEED
            deepspeed_config:
              zero_stage: 2
            gpu_ids: 0,1,2,3
            mixed_precision: fp16
            num_processes: 8
            num_machines: 1
            machine_rank: 0
            use_cpu: false
            debug: true
            """
        )
    )
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    monkeypatch.setenv("ACCELERATE_DEBUG_MODE", "true")  # `accelerate launch` sets it only with --debug: an exported one would reach the ranks
    plan = decide.plan(nbtools.detect(), 2)
    result = nbtools.accelerate_launch(worker, num_processes=2, timeout=180, options=LaunchOptions(echo=False))
    assert result.kv["world"] == str(plan.num_processes)
    assert result.kv["distributed_type"] == plan.distributed_type
    assert result.kv["backend"] == str(plan.backend)
    assert result.kv["debug_mode"] == "unset", "the user's `debug: true` or exported ACCELERATE_DEBUG_MODE reached the ranks"
    assert result.kv["visible"] == plan.env.get(str(nbtools.detect().visible_var), "unset"), result.kv
    # The same launch reading the user's config is a different launch: the fixture really bites.
    spec = decide.launch_spec(decide.LaunchCall.of(worker, num_processes=2), timeout=180)
    at = spec.head.index("--config_file")
    bare = dataclasses.replace(spec, head=spec.head[:at] + spec.head[at + 2:]).argv(nbtools.free_port())  # without it
    leaked = nbtools.run_command(bare, env=dict(spec.env), timeout=180, check=False, echo=False)
    assert leaked.returncode == 0 and leaked.kv.get("debug_mode") == "true", leaked.output[-2000:]


EXIT_BARRIER_LOG = textwrap.dedent(
    """
    print("world=2")
    p = "E1201 04:10:11.123000 1234 torch/distributed/elastic/agent/server/api.py:1008] "
    print(p + "Error waiting on exit barrier. Elapsed: 0.51 seconds")
    print(p + "Traceback (most recent call last):")
    print(p + '  File "api.py", line 1000, in _exit_barrier')
    print(p + "    store_util.barrier(")
    print(p + "torch.distributed.DistNetworkError: failed to recv, got 0 bytes")
    """
)


def test_the_exit_barrier_error_after_a_clean_exit_is_benign_and_said_so(python, capsys):
    result = nbtools.run_command([python, "-c", EXIT_BARRIER_LOG])
    assert result.ok and result.notes and "benign" in result.notes[0]
    assert result.notes[0] in capsys.readouterr().out  # shown in the cell, one line


@pytest.mark.parametrize(
    "tail, code",
    [
        ("", 1),  # a non-zero exit: the same log is no longer benign
        ("raise ValueError('a real error after the barrier')", 0),  # another traceback still fails
        # a rank's own traceback printed right after the barrier's, and the launch still exits 0: not benign
        ("import traceback, sys\ntry:\n    1 / 0\nexcept ZeroDivisionError:\n    traceback.print_exc(file=sys.stdout)", 0),
        ("print('[ERROR] something else')", 0),  # another marker still fails
    ],
)
def test_anything_beside_the_benign_exit_barrier_still_fails(python, tail, code):
    with pytest.raises(LaunchError):
        nbtools.run_command([python, "-c", EXIT_BARRIER_LOG + f"\n{tail}\nraise SystemExit({code})\n"], echo=False)


def test_non_zero_exit_raises_with_the_last_lines(python):
    with pytest.raises(LaunchError, match=r"(?s)exit code 3.*Last lines of the output:\n\s+bye"):
        nbtools.run_command([python, "-c", "print('bye'); raise SystemExit(3)"], echo=False)


def test_an_error_marker_fails_even_with_exit_code_0(python):
    code = "print('[ERROR] 2026-11-30 HCCL init failed ERR99999')"
    with pytest.raises(LaunchError, match="exited 0 but its output holds the error marker"):
        nbtools.run_command([python, "-c", code], echo=False)
    assert nbtools.run_command([python, "-c", code], echo=False, check=False).returncode == 0


def test_a_warning_written_into_another_ranks_line_is_put_on_its_own(python):
    """Two writers on one pipe: the value, then another rank's warning, then the value's newline
    (what an unbuffered print() and a rank's FutureWarning did in CI). The value still reads back."""
    program = (
        "import os; os.write(1, b'train_loss=0.0898'); "
        "os.write(1, b'/venv/torch/distributed/c10d_logger.py:83: FutureWarning: deprecated\\n  return f()\\n'); "
        "os.write(1, b'\\n')"
    )
    r = nbtools.run_command([python, "-c", program], echo=False)
    assert r.kv["train_loss"] == "0.0898", r.output
    assert "\n/venv/torch/distributed/c10d_logger.py:83: FutureWarning: deprecated\n" in r.output


@pytest.mark.parametrize("warning", [
    "[rank1]:[W1201 23:22:48.794764329 logger.cpp:329] Warning: Time stats are currently only collected for CPU",
    "[W1201 04:10:11.123000 1234 torch/csrc/distributed/c10d/ProcessGroupGloo.cpp:512] Warning: slow",
    # DeepSpeed's logger (07b's bf16 run on CPU: another rank's line read `adapter_dtype=torch.float32[2026-...`)
    "[2026-12-06 05:17:31,084] [WARNING] [real_accelerator.py:213:get_accelerator] Setting accelerator to CPU.",
])
def test_torchs_cpp_warning_written_into_another_ranks_line_is_put_on_its_own(warning):
    assert unglue_warning(f"device=npu final_loss=0.8119{warning}") == f"device=npu final_loss=0.8119\n{warning}"
    assert unglue_warning(warning) == warning and unglue_warning(f"x {warning}") == f"x {warning}"


def test_ranks_printing_the_same_key_line_at_once_are_put_on_lines_of_their_own():
    # 08b on the simulated NPU: every rank prints norm_dtype=... as it ends; print() writes the text and its newline
    # separately, so one rank's line landed at the end of another's (and the check read `torch.float32norm_dtype=...`)
    glued = "norm_dtype=torch.float32norm_dtype=torch.float32norm_dtype=torch.bfloat16\n"
    assert unglue_warning(glued) == "norm_dtype=torch.float32\nnorm_dtype=torch.float32\nnorm_dtype=torch.bfloat16\n"
    for written in ("a=1 a=2\n", "path=/x/path=y\n", "device=npu loss=0.5\n", "no key here\n"):
        assert unglue_warning(written) == written


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
        nbtools.run_command([python, "-c", code])
    finally:
        sys.stdout = old
    t_first = next(t for t, s in stamps if s == "first\n")
    t_second = next(t for t, s in stamps if s == "second\n")
    assert t_second - t_first > 1.5  # 'first' arrived before the child ended (PYTHONUNBUFFERED)


def test_hugging_face_is_kept_offline_unless_asked(python):
    code = "import os; print('offline=' + os.environ.get('HF_HUB_OFFLINE', 'unset'))"
    assert nbtools.run_command([python, "-c", code], echo=False).kv["offline"] == "1"
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    os_environ = os.environ.copy()
    try:
        os.environ.clear()
        os.environ.update(env)
        assert nbtools.run_command([python, "-c", code], echo=False, offline=False).kv["offline"] == "unset"
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
                nbtools.run_command([sys.executable, {str(spawner)!r}], timeout=300)
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


def test_a_gloo_teardown_abort_after_the_work_is_rerun_visibly_at_most_twice(tmp_path, capsys, monkeypatch):
    """torch's gloo sometimes aborts a rank at exit ('terminate called without an active exception')
    after all its work, even with end_training(). The launcher reruns the launch, saying so, at most
    twice; a third abort fails as usual. What is tested is the launcher's rule, so `accelerate` is a
    stand-in that runs the script in one process (six real launches would import torch six times)."""
    stand_in = tmp_path / "accelerate"
    stand_in.write_text(f"#!{sys.executable}\nimport os, sys\nscript = [a for a in sys.argv if a.endswith('.py')][-1]\n"
                        "os.execv(sys.executable, [sys.executable, script])\n")
    stand_in.chmod(0o755)
    monkeypatch.setattr("nbtools.decide.executable", lambda name: str(stand_in))
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
    script.write_text(src.replace("{limit}", "2"))
    result = nbtools.accelerate_launch(script, num_processes=1, timeout=120)
    assert result.kv["attempt"] == "3" and "attempt=1" not in result.output
    said = capsys.readouterr().out
    assert "running the whole launch again (1 of at most 2)" in said and "(2 of at most 2)" in said
    marker.unlink()
    script.write_text(src.replace("{limit}", "3"))
    with pytest.raises(LaunchError, match="gloo aborts at exit"):
        nbtools.accelerate_launch(script, num_processes=1, timeout=120, options=LaunchOptions(echo=False))
    assert marker.read_text() == "3"


@pytest.mark.parametrize("kind, simulated, rerun", [("cpu", False, True), ("npu", True, True), ("npu", False, False),
                                                   ("cuda", False, False)])
def test_the_teardown_abort_rerun_is_gloo_s_only(kind, simulated, rerun):
    """The rerun rule is about torch's gloo: the CPU route and the simulated NPU (hccl over gloo) get it, and
    the rerun line names which; a real NPU's or GPU's abort fails at once."""
    info = nbtools.DeviceInfo(kind=kind, count=2, names=[kind] * 2, versions={}, simulated=simulated,
                              visible_var=None if kind == "cpu" else "V", visible_devices=None)
    plan = decide.plan(info, 2)
    aborted = "eval_world=2\nterminate called without an active exception\n"
    assert diagnose.gloo_exit_abort(aborted, plan) is rerun
    assert diagnose.gloo_exit_abort("[rank1]: Traceback (most recent call last):\n" + aborted, plan) is False
    if rerun:
        line = guarded.retry_line("abort", None, 1, plan)
        assert ("not a property of hccl" in line) is simulated and ("on CPU" in line) is (kind == "cpu"), line


def test_the_printed_command_pasted_into_bash_gives_the_same_verdict(tmp_path, capsys, monkeypatch):
    """What a learner copies out of a cell: the `# runs here as:` line (or the `$` line when nothing changes)
    and the `# also set:` variables, pasted into bash in the work folder, run the same group with the same output."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "PYTHONUNBUFFERED"):
        monkeypatch.delenv(name, raising=False)  # a learner's terminal: the launcher sets them, and must say so
    (tmp_path / "w.py").write_text(WORKER)
    written = "ASCEND_RT_VISIBLE_DEVICES=0,1 accelerate launch --num_processes 2 w.py"
    result = nbtools.accelerate_launch("w.py", num_processes=2, timeout=240, options=LaunchOptions(cwd=tmp_path, as_written=written))
    printed = capsys.readouterr().out
    real = re.search(r"^# runs here as: (.*)$", printed, re.M) or re.search(r"^\$ (.*)$", printed, re.M)
    also = re.search(r"^# also set: (.*)$", printed, re.M)
    assert also and {"HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1", "PYTHONUNBUFFERED=1"} <= set(also.group(1).split()), printed
    pasted = f"export {also.group(1)}; {real.group(1)}"
    proc = subprocess.run(["bash", "-c", pasted], cwd=tmp_path, capture_output=True, text=True, timeout=240,
                          env={k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")})
    assert proc.returncode == result.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    keys = ("world", "distributed_type", "backend", "gathered")
    assert {k: nbtools.parse_kv(proc.stdout)[k] for k in keys} == {k: result.kv[k] for k in keys}, proc.stdout


def test_accelerate_launch_takes_its_options_by_name_and_never_a_why():
    import inspect

    params = inspect.signature(nbtools.accelerate_launch).parameters
    assert all(p.kind in (p.VAR_POSITIONAL, p.KEYWORD_ONLY) for n, p in params.items() if n != "script")
    assert "why" not in params and "why" not in {f.name for f in dataclasses.fields(LaunchOptions)}
    with pytest.raises(TypeError, match="tiemout"):
        nbtools.accelerate_launch("w.py", tiemout=5)
    with pytest.raises(TypeError, match="LaunchOptions.*ech"):
        LaunchOptions(ech=False)
