"""The learner-facing API: %cmd / %%cmd / %launch in a real IPython shell with real processes,
the rewrite rules of commands.py, and the session's work-folder rules."""

from __future__ import annotations

import os
import shutil
import stat
import sys
import textwrap
from pathlib import Path

import pytest

import nbtools
from nbtools import LaunchError, ParameterError, commands, decide, session, workdir
from nbtools.commands import CHECK_TORCH, CHECK_TORCH_WITHOUT_NPU, CommandNotHere
from nbtools.device import from_probe

CPU = {"python": "3.12.1", "torch": "2.9.0"}
NPU2 = {"python": "3.12.1", "torch": "2.9.0", "torch_npu": "2.9.0.post2", "cann": "9.1.0", "npu_available": True,
        "npu_count": 2, "npu_names": ["Ascend910B4"] * 2}
NPU1 = dict(NPU2, npu_count=1, npu_names=["Ascend910B4"])
CUDA2 = {"python": "3.12.1", "torch": "2.9.0", "cuda_available": True, "cuda_count": 2, "cuda_names": ["H100"] * 2}


def info(probe):
    return from_probe(probe, environ={})


# ---------------------------------------------------------------- parsing and rules (no processes)


def test_parse_options_env_prefix_and_argv():
    w = commands.parse("--timeout 30 --allow-fail --online ASCEND_RT_VISIBLE_DEVICES=0,1 A=b accelerate env")
    assert (w.timeout, w.allow_fail, w.online) == (30.0, True, True)
    assert w.env == {"ASCEND_RT_VISIBLE_DEVICES": "0,1", "A": "b"}
    assert w.argv == ["accelerate", "env"]
    assert w.text == "ASCEND_RT_VISIBLE_DEVICES=0,1 A=b accelerate env"


def test_parse_a_command_over_lines():
    body = 'python -c "\nimport sys\nprint(\'a\')\n" \\\n  --flag\n'
    w = commands.parse(body)
    assert w.argv == ["python", "-c", "\nimport sys\nprint('a')\n", "--flag"]
    with pytest.raises(ParameterError, match="one command per"):
        commands.parse("python --version\npython --version")
    with pytest.raises(ParameterError, match="cannot parse"):
        commands.parse('python -c "unclosed')
    with pytest.raises(ParameterError, match="unknown option"):
        commands.parse("--quiet python --version")


def test_rules_python_pip_uv_accelerate(monkeypatch):
    which = shutil.which  # no uv on this machine, whatever is installed
    monkeypatch.setattr(commands.shutil, "which", lambda name, **kw: None if name == "uv" else which(name, **kw))
    r = commands.command_here(commands.parse("python --version"), info(CPU))
    assert r.argv == [sys.executable, "--version"] and "内核自己的解释器" in r.why_line
    for written in ("pip install -U accelerate", "uv pip install -U accelerate"):
        r = commands.command_here(commands.parse(written), info(CPU))
        assert r.argv == [sys.executable, "-m", "pip", "--disable-pip-version-check", "install", "-U", "accelerate"]
    r = commands.command_here(commands.parse("accelerate env"), info(CPU))
    assert Path(r.argv[0]).name == "accelerate" and r.argv[1:] == ["env"]
    r = commands.command_here(commands.parse("git --version"), info(CPU))
    assert r.argv == ["git", "--version"] and not r.why


def test_visible_devices_variable_per_platform():
    w = "ASCEND_RT_VISIBLE_DEVICES=0,1 accelerate env"
    assert commands.command_here(commands.parse(w), info(NPU2)).env == {"ASCEND_RT_VISIBLE_DEVICES": "0,1"}
    cuda = commands.command_here(commands.parse(w), info(CUDA2))
    assert cuda.env == {"CUDA_VISIBLE_DEVICES": "0,1"} and "CUDA_VISIBLE_DEVICES" in cuda.why_line
    cpu = commands.command_here(commands.parse(w), info(CPU))
    assert cpu.env == {} and "去掉" in cpu.why_line


def test_npu_smi_absent_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(commands.shutil, "which", lambda name: None)
    with pytest.raises(CommandNotHere, match="只在装了 NPU 驱动的昇腾主机上有"):
        commands.command_here(commands.parse("npu-smi info"), info(CPU))
    assert issubclass(CommandNotHere, nbtools.NbtoolsError)


def test_check_torch_rewrite_only_for_that_program_and_only_without_torch_npu(monkeypatch):
    written = commands.parse(f'python -c "{CHECK_TORCH}"')
    monkeypatch.setattr(commands, "torch_npu_installed", lambda: False)
    r = commands.command_here(written, info(CPU))
    assert r.argv == [sys.executable, "-c", CHECK_TORCH_WITHOUT_NPU] and "这里没装 torch_npu" in r.why_line
    other = commands.parse('python -c "import torch, torch_npu; print(torch.npu.is_available())"')
    assert commands.command_here(other, info(CPU)).argv[2] == other.argv[2]  # no general rewriter
    monkeypatch.setattr(commands, "torch_npu_installed", lambda: True)
    assert commands.command_here(written, info(NPU2)).argv == [sys.executable, "-c", CHECK_TORCH]  # verbatim on NPU


def test_the_rewritten_check_torch_is_the_same_program_asking_cuda():
    assert CHECK_TORCH_WITHOUT_NPU == (
        CHECK_TORCH.replace("import torch, torch_npu", "import torch")
        .replace("torch_npu.__version__", "'not installed'")
        .replace("torch.npu.", "torch.cuda.")
    )


def test_parse_launch_splits_flags_script_and_args():
    call = decide.parse_launch(
        "--timeout 30 ASCEND_RT_VISIBLE_DEVICES=0,1 HCCL_CONNECT_TIMEOUT=600 accelerate launch --num_processes 3 "
        "--mixed_precision=bf16 --multi_gpu --gradient_accumulation_steps 2 --debug train_npu.py --steps 5"
    )
    assert (call.script, call.script_args) == ("train_npu.py", ["--steps", "5"])
    assert (call.num_processes, call.mixed_precision) == (3, "bf16")
    assert call.extra_flags == ["--gradient_accumulation_steps", "2", "--debug"]
    assert call.env == {"HCCL_CONNECT_TIMEOUT": "600"} and call.written_visible == "0,1"
    assert call.command.timeout == 30 and call.command.text.startswith("ASCEND_RT_VISIBLE_DEVICES=0,1 HCCL")
    assert decide.parse_launch("accelerate launch t.py").num_processes is None  # not written: the normaliser fills it
    with pytest.raises(ParameterError, match="use %cmd"):
        decide.parse_launch("python t.py")
    with pytest.raises(ParameterError, match="needs a script"):
        decide.parse_launch("accelerate launch --num_processes 2")


def why(call, machine, tmp_path):
    return decide.launch_spec(call, info=info(machine), cwd=tmp_path).why


def test_launch_why_names_the_reason_of_each_machine(tmp_path):
    call = decide.parse_launch("ASCEND_RT_VISIBLE_DEVICES=0,1 accelerate launch --num_processes 2 t.py")
    cpu = why(call, CPU, tmp_path)
    assert "只启动一个进程" in cpu and "ACCELERATE_USE_CPU=1 + --multi_gpu" in cpu
    fallback = why(call, NPU1, tmp_path)
    assert "CPU 代跑" in fallback and "只看得见 1 张 NPU" in fallback
    npu = why(call, NPU2, tmp_path)
    assert "空闲的会合端口代替 29500" in npu and "显式给出 Accelerate 的默认配置" in npu
    assert "CUDA_VISIBLE_DEVICES" in why(call, CUDA2, tmp_path)


def test_written_plan_flags_are_honoured_or_named(tmp_path):
    """--cpu means device='cpu' (on a 2-NPU host too); a written port is used and reported; any other flag the plan
    decides is named in the why line, never dropped silently."""
    spec = decide.launch_spec(decide.parse_launch("accelerate launch --cpu --num_processes 2 t.py"), info=info(NPU2),
                                cwd=tmp_path)
    assert spec.kind == "cpu" and spec.num_processes == 2 and "照写的 --cpu：在 CPU 上运行" in spec.why
    assert "ACCELERATE_USE_CPU=1" in spec.shown(None)
    spec = decide.launch_spec(decide.parse_launch("accelerate launch --num_processes 2 --main_process_port 29501 "
                                                      "--dynamo_backend inductor t.py"), info=info(NPU2), cwd=tmp_path)
    assert spec.port == 29501 and "--main_process_port 29501" in spec.shown(spec.port)
    assert "照写的会合端口 29501" in spec.why and "代替 29500" not in spec.why
    assert "你写的 --dynamo_backend 由本机的启动计划决定" in spec.why


def test_a_launch_on_the_simulated_npu_says_so(tmp_path):
    call = decide.parse_launch("accelerate launch --num_processes 2 t.py")
    sim = decide.launch_spec(call, info=info(dict(NPU2, torch_npu="2.9.0.post2+simulated", npu_simulated=True)), cwd=tmp_path)
    assert "模拟的 NPU" in sim.why and "不证明硬件" in sim.why and sim.note.startswith("NPU (simulated on CPU)：2 个进程")
    real = decide.launch_spec(call, info=info(NPU2), cwd=tmp_path)
    assert "模拟" not in real.why and real.note.startswith("NPU：2 个进程")


def test_the_why_line_follows_the_plan(tmp_path, monkeypatch):
    """The why line is made from the plan's own decisions: change the CPU route and the line follows."""
    call = decide.parse_launch("accelerate launch --num_processes 2 t.py")
    monkeypatch.setattr(decide, "cpu_route", lambda n: ({"ACCELERATE_USE_CPU": "1"}, ["--use_fsdp"], "X + --use_fsdp"))
    spec = decide.launch_spec(call, info=info(CPU), cwd=tmp_path)
    assert "--use_fsdp" in spec.shown(None) and "X + --use_fsdp" in spec.why and "--multi_gpu" not in spec.shown(None)


def test_a_learners_config_file_is_read_for_processes_and_precision_and_named_in_the_why(tmp_path):
    config = tmp_path / "fsdp.yaml"
    config.write_text("distributed_type: FSDP\nnum_processes: 3\nmixed_precision: bf16\nfsdp_config:\n  fsdp_version: 2\n")
    call = decide.parse_launch(f"accelerate launch --config_file {config} t.py")
    assert (call.num_processes, call.mixed_precision, call.extra_flags) == (3, "bf16", ["--config_file", str(config)])
    written = decide.parse_launch(f"accelerate launch --config_file {config} --num_processes 2 --mixed_precision no t.py")
    assert (written.num_processes, written.mixed_precision) == (2, "no")  # the command line wins, as in accelerate
    npu = decide.launch_spec(written, info=info(NPU2), cwd=tmp_path)
    assert f"照写的用你的 --config_file {config}（distributed_type FSDP）" in npu.why and "默认配置" not in npu.why
    assert npu.shown(None).count("--config_file") == 1
    for flags in (["--config_file", str(config)], [f"--config_file={config}"]):  # built in code, either form
        built = decide.launch_spec(decide.LaunchCall.of("t.py", extra_flags=flags), info=info(NPU2), cwd=tmp_path)
        assert "distributed_type FSDP" in built.why and built.shown(None).count("--config_file") == 1, built.shown(None)
    assert "只在加速卡上启用 FSDP，所以这份配置在这里跑的是 DDP" in why(call, CPU, tmp_path)
    with pytest.raises(ParameterError, match="cannot read it"):
        decide.parse_launch(f"accelerate launch --config_file {tmp_path / 'missing.yaml'} t.py")


def test_shown_keeps_a_program_readable():
    assert commands.shell_line(["python", "-c", "print('a b')"], {"A": "1"}) == "A=1 python -c \"print('a b')\""


# ---------------------------------------------------------------- the magics with real processes


@pytest.fixture(scope="module")
def ip():
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    shell.run_line_magic("load_ext", "nbtools")
    return shell


def run_cell(ip, source):
    result = ip.run_cell(source, store_history=False)
    return result.error_in_exec


def test_cmd_line_form_returns_a_result(ip, capsys):
    assert run_cell(ip, "r_py = %cmd python --version") is None
    r = ip.user_ns["r_py"]
    v = sys.version_info
    assert r.output.strip() == f"Python {v.major}.{v.minor}.{v.micro}" and r.returncode == 0
    assert r.as_written == "python --version" and r.command.startswith(sys.executable)
    out = capsys.readouterr().out
    assert out.startswith("$ python --version\n# runs here as: ") and "# why: `python`" in out
    assert ip.user_ns["nbtools"] is nbtools  # %load_ext makes nbtools usable by name


def test_cmd_cell_form_runs_a_multi_line_python_c(ip):
    ip.user_ns["num_processes"] = 3
    source = textwrap.dedent(
        '''\
        %%cmd r_multi
        python -c "
        import sys
        d = {'k': 1}
        print(f'args={len(sys.argv)} d={len(d)}')
        print('n={num_processes}')
        print('arg=' + sys.argv[1])
        " \\
          n{num_processes}
        '''
    )
    assert run_cell(ip, source) is None
    r = ip.user_ns["r_multi"]
    # the program reaches Python as written (its braces are its own); outside it, {num_processes} is expanded
    assert r.kv == {"args": "2", "d": "1", "n": "{num_processes}", "arg": "n3"}, r.output


def test_a_failing_command_raises_and_allow_fail_returns(ip):
    err = run_cell(ip, "r_bad = %cmd python -c \"import sys; print('partial'); sys.exit(3)\"")
    assert isinstance(err, LaunchError) and "exit code 3" in str(err) and "partial" in str(err)
    assert err.result.as_written.startswith("python -c")
    err = run_cell(ip, "r_marker = %cmd python -c \"print('[ERROR] device lost')\"")
    assert isinstance(err, LaunchError) and "error marker" in str(err)
    assert run_cell(ip, "r_ok = %cmd --allow-fail python -c \"import sys; sys.exit(4)\"") is None
    assert ip.user_ns["r_ok"].returncode == 4
    err = run_cell(ip, "r_slow = %cmd --timeout 2 python -c \"import time; time.sleep(60)\"")
    assert isinstance(err, nbtools.LaunchTimeout)


def test_check_torch_as_written_runs_here(ip):
    ip.user_ns["CHECK"] = CHECK_TORCH
    assert run_cell(ip, 'r_torch = %cmd python -c "{CHECK}"') is None
    kv = ip.user_ns["r_torch"].kv
    assert nbtools.same_version(kv["torch"], nbtools.installed("torch"))
    want = nbtools.installed("torch-npu") or "not installed"
    assert kv["torch_npu"] == want or nbtools.same_version(kv["torch_npu"], want)
    assert kv["is_available"] in ("True", "False") and kv["count"].isdigit()


def test_written_cpu_launch_starts_num_processes_ranks(ip, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train_npu.py").write_text(
        "from accelerate import Accelerator\n"
        "acc = Accelerator()\n"
        "acc.print(f'world={acc.num_processes} type={acc.distributed_type.name} backend={acc.state.backend}')\n"
        "acc.end_training()\n"
    )
    ip.user_ns["num_processes"] = 3
    line = "r_l = %launch ASCEND_RT_VISIBLE_DEVICES=0,1,2 accelerate launch --num_processes {num_processes} train_npu.py"
    if nbtools.detect().kind != "cpu":
        pytest.skip("checks the CPU route (ACCELERATE_USE_CPU=1 + --multi_gpu)")
    assert run_cell(ip, line) is None
    r = ip.user_ns["r_l"]
    assert r.kv == {"world": "3", "type": "MULTI_CPU", "backend": "gloo"}, r.output
    assert r.plan.num_processes == 3 and r.plan.backend == "gloo"
    assert r.as_written.endswith("--num_processes 3 train_npu.py")
    assert "ACCELERATE_USE_CPU=1" in r.command and "--multi_gpu" in r.command


def test_cmd_refuses_accelerate_launch_unless_as_written(ip, tmp_path, monkeypatch):
    """%cmd has no launch rule: a written `accelerate launch` there would start ONE process on a CPU, silently.
    It is refused with the sentence pointing to %launch; --as-written runs the line as it is (05's trap)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "w.py").write_text("import os\nprint(f\"rank={os.environ.get('RANK', 'none')}\")\n")
    err = run_cell(ip, "r_c = %cmd accelerate launch --num_processes 2 w.py")
    assert isinstance(err, ParameterError) and "%launch accelerate launch" in str(err) and "--as-written" in str(err)
    assert "r_c" not in ip.user_ns  # nothing ran
    assert run_cell(ip, "r_w = %cmd --as-written accelerate launch --num_processes 2 w.py") is None
    assert ip.user_ns["r_w"].as_written == "accelerate launch --num_processes 2 w.py"
    if nbtools.detect().kind == "cpu":  # the trap itself: one process, no error
        assert ip.user_ns["r_w"].output.count("rank=") == 1, ip.user_ns["r_w"].output
    assert run_cell(ip, "r_t = %cmd accelerate --help") is None  # other accelerate commands run as written


def test_an_fsdp_config_under_the_cpu_route_runs_ddp_as_the_why_line_says(ip, tmp_path, monkeypatch):
    """The why line's claim, held on the installed Accelerate: with ACCELERATE_USE_CPU=1 an FSDP config runs DDP."""
    if nbtools.detect().kind != "cpu":
        pytest.skip("checks the CPU route (ACCELERATE_USE_CPU=1 + --multi_gpu)")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fsdp.yaml").write_text("distributed_type: FSDP\nnum_processes: 2\nmixed_precision: 'no'\n"
                                        "fsdp_config:\n  fsdp_version: 2\n")
    (tmp_path / "which.py").write_text(
        "from accelerate import Accelerator\nacc = Accelerator()\n"
        "acc.print(f'world={acc.num_processes} type={acc.distributed_type.name}')\nacc.end_training()\n"
    )
    assert run_cell(ip, "r_f = %launch accelerate launch --config_file fsdp.yaml which.py") is None
    assert ip.user_ns["r_f"].kv == {"world": "2", "type": "MULTI_CPU"}, ip.user_ns["r_f"].output


# ---------------------------------------------------------------- session and work folders


def test_unattended_detection():
    assert workdir.unattended({"NBTOOLS_UNATTENDED": "1"})
    assert workdir.unattended({"CI": "true"})
    assert workdir.notebook_stem({"JPY_SESSION_NAME": "/home/u/notebooks/00_environment.ipynb"}) == "00_environment"
    assert workdir.notebook_stem({}) == "notebook"


def test_setup_interactive_makes_a_persistent_folder_and_chdirs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(session, "unattended", lambda: False)
    monkeypatch.setenv("JPY_SESSION_NAME", str(tmp_path / "00_environment.ipynb"))
    S = nbtools.setup(num_processes=3, info=info(CPU))
    assert S.work == tmp_path / "work" / "00_environment" and Path.cwd() == S.work
    assert (S.plan.num_processes, S.device, S.visible) == (3, "cpu", "0,1,2")
    out = capsys.readouterr().out
    assert "CPU 代跑" in out and f"工作文件夹：{S.work}" in out and len(out.splitlines()) <= 6
    (S.work / "train_npu.py").write_text("x")
    S.close()
    assert Path.cwd() == tmp_path and (S.work / "train_npu.py").exists()
    assert "已保留" in capsys.readouterr().out
    S2 = nbtools.setup(info=info(CPU))  # the same folder again: the learner's files stay
    assert S2.work == S.work and (S2.work / "train_npu.py").exists()
    nbtools.setup(info=info(CPU))  # setup cell run twice: starts from the original cwd again
    assert session.current().origin == tmp_path
    session.current().close()
    assert Path.cwd() == tmp_path


def test_setup_unattended_uses_a_temp_folder_removed_by_close(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(session, "unattended", lambda: True)
    S = nbtools.setup(info=info(CPU))
    assert Path.cwd() == S.work and not S.work.is_relative_to(tmp_path) and S.work.exists()
    assert stat.S_IMODE(os.stat(S.work).st_mode) == 0o700  # private: others on a shared machine cannot read it
    S.close()
    assert not S.work.exists() and Path.cwd() == tmp_path and session.current() is None


def test_setup_with_an_existing_work_dir_never_removes_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("the learner's file")
    S = nbtools.setup(work_dir=str(mine), info=info(CPU))
    assert S.work == mine
    S.close()
    assert (mine / "notes.txt").exists() and "原样留下" in capsys.readouterr().out
    S = nbtools.setup(work_dir=str(tmp_path / "new"), keep_work_dir=False, info=info(CPU))
    S.close()
    assert not (tmp_path / "new").exists()  # made by nbtools, not kept: removed
    S = nbtools.setup(work_dir=str(tmp_path / "kept"), keep_work_dir=True, info=info(CPU))
    S.close()
    assert (tmp_path / "kept").exists()


def test_setup_rejects_bad_parameters(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ParameterError, match="num_processes"):
        nbtools.setup(num_processes=0, info=info(CPU))
    with pytest.raises(ParameterError, match="device"):
        nbtools.setup(device="tpu", info=info(CPU))
    assert Path.cwd() == tmp_path and os.getcwd() == str(tmp_path)


def test_a_cell_program_keeps_its_own_braces_even_when_the_notebook_defines_the_name():
    from nbtools.magics import expand_outside_program

    ns = {"i": 5, "timeout_s": 9}
    body = '--timeout {timeout_s} python -c "\nfor i in range(2):\n    print(f\'x={i}\')\n" --flag={i}'
    out = expand_outside_program(body, ns)
    assert out.startswith("--timeout 9 python -c")
    assert "print(f'x={i}')" in out, out  # the program reaches Python as written
    assert out.endswith("--flag=5"), out  # outside the program, fields are expanded


def test_cards_are_the_kernels_own_visible_ones(tmp_path):
    """05 and 06 write device lists from S.cards: on a shared host where this learner sees cards 4-7, never card 0."""
    shared = from_probe(dict(NPU2, npu_count=4, npu_names=["Ascend910B4"] * 4), environ={"ASCEND_RT_VISIBLE_DEVICES": "4,5,6,7"})
    S = nbtools.setup(num_processes=2, work_dir=str(tmp_path), info=shared)
    try:
        assert (S.cards(1), S.cards(), S.cards(4), S.visible) == ("4", "4,5", "4,5,6,7", "4,5")
    finally:
        S.close()
    one = from_probe(dict(NPU2, npu_count=1, npu_names=["Ascend910B4"]), environ={"ASCEND_RT_VISIBLE_DEVICES": "1"})
    S = nbtools.setup(num_processes=1, work_dir=str(tmp_path), info=one)
    try:
        assert (S.cards(1), S.cards(2)) == ("1", "1,2")  # more than it may use: ascending, never card 1 twice
    finally:
        S.close()
    cuda = from_probe(dict(CUDA2), environ={"CUDA_VISIBLE_DEVICES": "5,4"})  # CUDA takes any order
    S = nbtools.setup(num_processes=2, work_dir=str(tmp_path), info=cuda)
    try:
        assert (S.cards(), S.cards(3)) == ("5,4", "5,4,6")  # after the highest card, never 5 again
    finally:
        S.close()
    S = nbtools.setup(num_processes=2, work_dir=str(tmp_path), info=info(CPU))
    try:
        assert (S.cards(1), S.cards(3)) == ("0", "0,1,2")  # no card: 0, 1, ... (dropped on a CPU anyway)
    finally:
        S.close()


def test_uv_pip_runs_uv_aimed_at_the_kernels_interpreter_where_uv_is_installed(tmp_path, monkeypatch):
    """`uv pip install` as the quick-start writes it: uv itself with --python <the kernel's interpreter>; without uv,
    the kernel's pip, and the why line says there is no uv."""
    uv = tmp_path / "uv"
    uv.write_text("#!/bin/sh\necho uv \"$@\"\n")
    uv.chmod(0o755)
    written = commands.parse("uv pip install --index-url https://mirrors.aliyun.com/pypi/simple accelerate")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    real = commands.command_here(written, info(CPU))
    assert real.argv == [str(uv), "pip", "install", "--python", sys.executable, "--index-url",
                         "https://mirrors.aliyun.com/pypi/simple", "accelerate"], real.argv
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    real = commands.command_here(written, info(CPU))
    assert real.argv[:3] == [sys.executable, "-m", "pip"] and "这里没有 uv" in real.why_line, real.argv
