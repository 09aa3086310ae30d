"""nbtools.machines: the written multi-machine command and its stand-in here, and several jobs at
once where the first failure stops the others. Real processes, no mocks."""

from __future__ import annotations

import json
import sys
import time
import uuid

import pytest
from conftest import processes_mentioning, wait_gone

from nbtools import LaunchError, LaunchTimeout, ParameterError, free_port
from nbtools.decide import NORMALISED_ENV
from nbtools.machines import MACHINE_ENV, Job, failure_error, first_failure, run_all, run_machines, stand_in

WRITTEN = (
    "ASCEND_RT_VISIBLE_DEVICES=0,1 accelerate launch --num_machines 2 --num_processes 4 --machine_rank 1 "
    "--main_process_ip 127.0.0.1 --main_process_port 29500 --same_network multinode_check.py"
)


def set_(env: dict) -> dict:
    """The variables a job sets; None marks one it removes (an ACCELERATE_* exported in the caller's shell)."""
    return {k: v for k, v in env.items() if v is not None and k != NORMALISED_ENV}  # the normaliser's marker aside


def py(code: str) -> Job:
    return Job([sys.executable, "-c", code], {})


def test_simulated_keeps_the_written_command_and_runs_cpu_ranks(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job = stand_in(WRITTEN)
    assert job.as_written == WRITTEN
    assert set_(job.env) == {"ACCELERATE_USE_CPU": "1"}  # the NPU variable is dropped, the CPU route added
    assert job.argv[0].endswith("accelerate") and job.argv[1] == "launch"
    flags = job.argv[2:]
    assert flags.count("--multi_gpu") == 1
    assert flags[flags.index("--machine_rank") + 1] == "1" and flags[flags.index("--num_processes") + 1] == "4"
    assert flags[-1] == "multinode_check.py"
    assert job.shown.startswith("ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --config_file accelerate_config_no.json "
                                "--num_machines 2")
    assert not (tmp_path / "accelerate_config_no.json").exists()  # decided, not written: the launch writes it
    assert json.loads(dict(job.spec.files)[str(tmp_path / "accelerate_config_no.json")])["distributed_type"] == "NO"
    assert "hccl" in job.why and "真正的 4 个 rank 的 gloo 进程组" in job.why  # --num_processes counts every machine's ranks


def test_simulated_does_not_repeat_a_written_multi_gpu_and_keeps_other_variables(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job = stand_in("HCCL_IF_IP=10.0.0.1 accelerate launch --multi_gpu --machine_rank 0 x.py")
    assert job.argv[2:].count("--multi_gpu") == 1
    assert set_(job.env) == {"HCCL_IF_IP": "10.0.0.1", "ACCELERATE_USE_CPU": "1"}


def test_simulated_refuses_other_commands():
    with pytest.raises(ParameterError):
        stand_in("python train.py")


def test_all_jobs_pass_and_keep_their_own_output():
    outcomes = run_all([py("print('job=0')"), py("print('job=1')")], timeout=60)
    assert [o.error for o in outcomes] == [None, None]
    assert [o.output.strip() for o in outcomes] == ["job=0", "job=1"]
    assert first_failure(outcomes) is None and failure_error(outcomes, 60) is None


def test_every_process_of_a_job_carries_its_marker():
    code = f"import os; print('{MACHINE_ENV}=' + os.environ['{MACHINE_ENV}'])"
    outcomes = run_all([py(code), py(code)], timeout=60)
    marks = [o.output.strip().split("=", 1)[1] for o in outcomes]
    assert len(set(marks)) == 2 and all(m.endswith(f"-{i}") for i, m in enumerate(marks))


def test_the_first_failure_stops_the_others_with_their_whole_tree():
    token = f"machines-test-{uuid.uuid4().hex[:8]}"
    # job 0 hangs, and has a grandchild in its own session (as torch elastic's workers are)
    hang = py(
        "import subprocess, sys, time; "
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)  # {token}'], start_new_session=True); "
        f"time.sleep(120)  # {token}"
    )
    crash = py("import time; time.sleep(2); raise SystemExit(3)")
    start = time.monotonic()
    outcomes = run_all([hang, crash], timeout=100)
    assert time.monotonic() - start < 30, "the hanging job was not stopped when the other failed"
    assert outcomes[1].error is not None and not outcomes[1].stopped and outcomes[1].result.returncode == 3
    assert outcomes[0].error is not None and outcomes[0].stopped
    assert first_failure(outcomes) == 1
    msg = str(failure_error(outcomes, 100))
    assert msg.startswith("machine 1 failed first") and "machine 0: stopped" in msg
    assert wait_gone(token) == [], processes_mentioning(token)


def test_a_timeout_stops_every_job_and_says_so():
    token = f"machines-test-{uuid.uuid4().hex[:8]}"
    start = time.monotonic()
    outcomes = run_all([py(f"import time; time.sleep(120)  # {token}")] * 2, timeout=3)
    assert time.monotonic() - start < 30
    assert all(isinstance(o.error, LaunchTimeout) for o in outcomes)
    assert "still running after timeout_s=3" in str(failure_error(outcomes, 3))
    assert wait_gone(token) == []


def test_run_machines_raises_naming_the_machine_that_failed(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    # Two written machine commands whose script does not exist: both fail fast, and the cell says which first.
    port = free_port()
    texts = [
        WRITTEN.replace("--machine_rank 1", f"--machine_rank {r}").replace("29500", str(port))
        .replace("multinode_check.py", "/nonexistent.py")
        for r in range(2)
    ]
    with pytest.raises(LaunchError) as err:
        run_machines(texts, timeout=120)
    out = capsys.readouterr().out
    assert f"$ {texts[0]}" in out and "# runs here as: ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu" in out
    assert "===== machine 0" in out and "===== machine 1" in out
    assert "failed first" in str(err.value)


ABORTS_ONCE = """import os, pathlib, sys
rank = os.environ["MACHINE_RANK"]
tries = pathlib.Path(f"tries-{rank}")
tries.write_text(tries.read_text() + "x" if tries.exists() else "x")
print(f"machine={rank} try={len(tries.read_text())}", flush=True)
if rank == "0" and len(tries.read_text()) == 1:  # machine 0's first try: torch's gloo teardown abort, after its work
    sys.stderr.write("terminate called without an active exception\\n")
    sys.stderr.flush()
    os.abort()
"""


def test_a_gloo_teardown_abort_reruns_every_machine_through_the_launchers_loop(tmp_path, monkeypatch, capsys):
    """06's machines run through guarded.launch's rerun loop: machine 0 aborting at exit after its work (the gloo
    teardown race) reruns both machines once, said in the cell as a single launch's rerun is. `accelerate` is a
    stand-in that runs the script in one process, with the machine's rank in MACHINE_RANK."""
    monkeypatch.chdir(tmp_path)
    stand = tmp_path / "accelerate"
    stand.write_text(f"#!{sys.executable}\nimport os, sys\nargv = sys.argv\n"
                     "os.environ['MACHINE_RANK'] = argv[argv.index('--machine_rank') + 1]\n"
                     "os.execv(sys.executable, [sys.executable, [a for a in argv if a.endswith('.py')][-1]])\n")
    stand.chmod(0o755)
    monkeypatch.setattr("nbtools.decide.executable", lambda name: str(stand))
    (tmp_path / "aborts_once.py").write_text(ABORTS_ONCE)
    texts = [WRITTEN.replace("--machine_rank 1", f"--machine_rank {r}").replace("multinode_check.py", "aborts_once.py")
             for r in range(2)]
    results = run_machines(texts, timeout=60)
    out = capsys.readouterr().out
    assert out.count("running the whole launch again (1 of at most 2)") == 1 and "(2 of at most 2)" not in out, out
    assert [r.kv["try"] for r in results] == ["2", "2"], out  # every machine ran again, and passed
    assert "machine=0 try=2" in out and "===== machine 0 (ok) =====" in out


def test_simulated_keeps_the_users_accelerate_variables_out(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    job = stand_in(WRITTEN)
    assert job.env["ACCELERATE_MIXED_PRECISION"] is None and job.env["ACCELERATE_USE_CPU"] == "1"  # None: removed
    assert "ACCELERATE_MIXED_PRECISION" not in job.shown


SCRIPT = """
import os
from accelerate import Accelerator
a = Accelerator()
print(f"machine={os.environ['GROUP_RANK']} rank={a.process_index} world={a.num_processes} "
      f"type={a.distributed_type.name} precision={a.mixed_precision}", flush=True)
a.end_training()
"""


def test_two_machines_meet_in_one_group_whatever_the_users_config(tmp_path, monkeypatch, capsys):
    # A user's `accelerate config` that would turn every launch into DeepSpeed with fp16.
    (tmp_path / "hf" / "accelerate").mkdir(parents=True)
    (tmp_path / "hf" / "accelerate" / "default_config.yaml").write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\nmixed_precision: fp16\nnum_processes: 8\n"
    )
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    script = tmp_path / "machine_check.py"
    script.write_text(SCRIPT)
    port = free_port()
    texts = [
        f"ASCEND_RT_VISIBLE_DEVICES=0 accelerate launch --num_machines 2 --num_processes 2 --machine_rank {r} "
        f"--main_process_ip 127.0.0.1 --main_process_port {port} --same_network {script}"
        for r in range(2)
    ]
    monkeypatch.chdir(tmp_path)
    results = run_machines(texts, timeout=240)
    for r, result in enumerate(results):
        assert f"machine={r} rank={r} world=2 type=MULTI_CPU precision=no" in result.output, result.output[-2000:]
    # the config that keeps the user's out is in the shown command and stays beside it: pasted, it runs as shown
    assert capsys.readouterr().out.count("--config_file accelerate_config_no.json") == 2
    assert (tmp_path / "accelerate_config_no.json").is_file()


# torch's log formatter repeats the record's prefix on every line, the traceback's included (seen with torch 2.14:
# logger.exception(...) through torch.distributed.elastic.utils.logging)
BARRIER = (
    "p = 'E1201 04:10:11.123000 1234 torch/distributed/elastic/agent/server/api.py:1008] '\n"
    "print('machine_rank=1 world=2')\n"
    "print(p + 'Error waiting on exit barrier. Elapsed: 0.5 seconds')\n"
    "print(p + 'Traceback (most recent call last):')\n"
    "print(p + '  File \"api.py\", line 1, in _exit_barrier')\n"
    "print(p + 'torch.distributed.DistNetworkError: failed to recv, got 0 bytes')\n"
)


def test_the_exit_barrier_traceback_after_a_clean_exit_is_one_line(capsys):
    from nbtools.machines import print_outcomes

    outcomes = run_all([py(BARRIER)], timeout=60)
    assert outcomes[0].error is None, outcomes[0].error  # benign: the launch is not failed
    print_outcomes(outcomes)
    out = capsys.readouterr().out
    assert "machine_rank=1 world=2" in out and "Traceback" not in out and "exit barrier" in out
    assert len([ln for ln in out.splitlines() if "exit barrier" in ln]) == 1
