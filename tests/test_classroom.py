"""tools/classroom.py: N learner containers on one Ascend host, on the simulated NPU's 8-card npu-smi.

No docker here: the scripts it writes run against a stand-in `docker` first on PATH that logs its arguments."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

from nbtools import floors, simnpu_env

SCRIPT = str(Path(ROOT) / "tools" / "classroom.py")
DOCKERFILE = Path(ROOT) / "tools" / "classroom.Dockerfile"
HOST_CPUS, HOST_GIB = 34, 72  # the host the tests pretend to be (--host-cpus, --host-memory)
# the kit: what tools/classroom.py reads from its repository (a copy of it can have a wheelhouse/)
KIT = ("tools/classroom.py", "tools/classroom.Dockerfile", "nbtools/floors.py", "nbtools/npusmi.py")


def _module():
    spec = importlib.util.spec_from_file_location("classroom", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


classroom = _module()


def _classroom(tmp_path: Path, *args: str, script: str = SCRIPT, out: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, **simnpu_env.environment(cards=8))  # its npu-smi lists 8 cards, as an 8-card host's does
    host = ["--host-cpus", str(HOST_CPUS), "--host-memory", f"{HOST_GIB}g", "--home", str(tmp_path / "home")]
    return subprocess.run([sys.executable, script, *host, *args, "--out", str(out or tmp_path / "start.sh")], env=env,
                          capture_output=True, text=True, timeout=120)


def _docker(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment whose `docker` logs its arguments (one JSON list a line) and succeeds, and that log."""
    bin_dir, log = tmp_path / "bin", tmp_path / "docker.log"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "docker"
    fake.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                    "with open(os.environ['DOCKER_LOG'], 'a') as f:\n    f.write(json.dumps(sys.argv[1:]) + '\\n')\n")
    fake.chmod(0o755)
    return dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", DOCKER_LOG=str(log)), log


def _bash(script: Path, env: dict[str, str], log: Path, *args: str) -> list[list[str]]:
    """Run a written script; the docker calls it made."""
    log.write_text("")
    proc = subprocess.run(["bash", str(script), *args], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [json.loads(line) for line in log.read_text().splitlines()]


def _option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def _kit(tmp_path: Path) -> Path:
    kit = tmp_path / "kit"
    for rel in KIT:
        (kit / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(Path(ROOT) / rel, kit / rel)
    return kit


def test_four_learners_on_an_8_card_host_get_disjoint_pairs_of_cards(tmp_path):
    proc = _classroom(tmp_path, "--learners", "4")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    script = (tmp_path / "start.sh").read_text()
    runs = [line for line in script.splitlines() if line.startswith("docker run")]
    cards = [re.findall(r"--device=/dev/davinci(\d+)\b", line) for line in runs]
    assert len(runs) == 4 and all(len(c) == 2 for c in cards), cards
    assert sorted(int(c) for pair in cards for c in pair) == list(range(8))  # disjoint, every card used once
    ports = [re.search(r"-p (\d+):8888", line).group(1) for line in runs]
    tokens = re.findall(r"token=([0-9a-f]{32})", proc.stdout)
    assert len(set(ports)) == 4 and len(set(tokens)) == 4, proc.stdout
    assert script.count("docker build") == 1 and all("/dev/davinci_manager" in line for line in runs)
    assert subprocess.run(["bash", "-n", str(tmp_path / "start.sh")]).returncode == 0


def test_more_learners_than_cards_is_refused_with_the_hosts_needed(tmp_path):
    proc = _classroom(tmp_path, "--learners", "5")
    assert proc.returncode != 0 and "10 cards; this host has 8: use 2 hosts" in proc.stderr, proc.stderr
    assert not (tmp_path / "start.sh").exists()


def test_the_start_script_run_twice_builds_once_and_replaces_each_container_and_the_stop_script_removes_them(tmp_path):
    learners, per, first = 4, 2, 9000
    proc = _classroom(tmp_path, "--learners", str(learners), "--cards-per-learner", str(per), "--first-port", str(first))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    env, log = _docker(tmp_path)
    calls = _bash(tmp_path / "start.sh", env, log)
    assert [c[0] for c in calls] == ["build"] + ["rm", "run"] * learners, calls
    assert f"BASE={floors.IMAGE}" in calls[0] and calls[0][-1] == str(Path(ROOT).resolve()), calls[0]  # the quick-start's image, the kit
    runs = calls[2::2]
    names = [_option(run, "--name") for run in runs]
    assert [c for c in calls[1::2]] == [["rm", "-f", name] for name in names]  # each run replaces its name
    cards = [int(a.removeprefix("--device=/dev/davinci")) for run in runs for a in run if re.fullmatch(r"--device=/dev/davinci\d+", a)]
    assert sorted(cards) == list(range(learners * per)), cards  # disjoint
    cpus = (HOST_CPUS - classroom.RESERVE_CPUS) / learners
    mib = (HOST_GIB * 1024 - classroom.RESERVE_MIB) // learners
    assert all(float(_option(run, "--cpus")) == cpus and _option(run, "--memory") == f"{mib}m" for run in runs), runs
    assert sorted(_option(run, "-p") for run in runs) == [f"{first + k}:8888" for k in range(learners)]
    firewall = f"TCP {first}-{first + learners - 1}"
    assert firewall in proc.stdout and firewall in (tmp_path / "start.sh").read_text().split("set -euo")[0]
    assert _bash(tmp_path / "start.sh", env, log) == calls  # again: the same build, the same containers replaced
    home = tmp_path / "home"
    for name in names:
        (home / name / "notes.txt").write_text(name)
    assert _bash(tmp_path / "stop.sh", env, log) == [["rm", "-f", *names]]  # exactly these containers
    assert all((home / name / "notes.txt").read_text() == name for name in names)  # the work folders stay


def test_the_stop_script_with_archive_moves_the_work_folders_aside_for_the_next_group(tmp_path):
    proc = _classroom(tmp_path, "--learners", "3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    env, log = _docker(tmp_path)
    names = [_option(c, "--name") for c in _bash(tmp_path / "start.sh", env, log) if c[0] == "run"]
    home = tmp_path / "home"
    for name in names:
        (home / name / "notes.txt").write_text(name)
    assert _bash(tmp_path / "stop.sh", env, log, "--archive") == [["rm", "-f", *names]]
    (stamp,) = (home / "archive").iterdir()
    assert all((stamp / name / "notes.txt").read_text() == name and not (home / name).exists() for name in names)
    _bash(tmp_path / "start.sh", env, log)
    assert all(list((home / name).iterdir()) == [] for name in names)  # the next group's folders start empty


def test_limits_that_do_not_fit_the_host_are_refused(tmp_path):
    learners = 4
    spare_cpus, spare_mib = HOST_CPUS - classroom.RESERVE_CPUS, HOST_GIB * 1024 - classroom.RESERVE_MIB
    fits = _classroom(tmp_path, "--learners", str(learners), "--cpus-per-learner", str(spare_cpus / learners),
                      "--memory-per-learner", f"{spare_mib // learners}m")
    assert fits.returncode == 0, fits.stderr  # the whole share, exactly
    (tmp_path / "start.sh").unlink()
    (tmp_path / "stop.sh").unlink()
    refused = [
        (("--cpus-per-learner", str(spare_cpus / learners + 1)), f"--cpus-per-learner {spare_cpus // learners} or less"),
        (("--memory-per-learner", f"{spare_mib // learners + 1024}m"), f"--memory-per-learner {spare_mib // learners}m or less"),
        (("--host-cpus", str(classroom.RESERVE_CPUS + learners * classroom.MIN_CPUS - 1)), "at least"),
        (("--host-memory", f"{(classroom.RESERVE_MIB + learners * classroom.MIN_MIB) // 1024 - 1}g"), "at least"),
    ]
    for args, said in refused:
        proc = _classroom(tmp_path, "--learners", str(learners), *args)
        assert proc.returncode != 0 and said in proc.stderr, (args, proc.stderr)
        assert not (tmp_path / "start.sh").exists() and not (tmp_path / "stop.sh").exists(), args


def test_the_offline_option_builds_from_the_wheelhouse_in_the_build_context(tmp_path):
    kit = _kit(tmp_path)
    script = str(kit / "tools" / "classroom.py")
    proc = _classroom(tmp_path, "--learners", "1", "--wheelhouse", script=script)
    assert proc.returncode != 0 and "wheelhouse" in proc.stderr and not (tmp_path / "start.sh").exists(), proc.stderr
    (kit / "wheelhouse").mkdir()
    (kit / "wheelhouse" / "accelerate-1.15.0-py3-none-any.whl").write_bytes(b"")
    env, log = _docker(tmp_path)
    for offline in (False, True):
        proc = _classroom(tmp_path, "--learners", "1", *(["--wheelhouse"] if offline else []), script=script)
        assert proc.returncode == 0, proc.stderr
        build = _bash(tmp_path / "start.sh", env, log)[0]
        assert build[0] == "build" and build[-1] == str(kit.resolve()), build  # the context holds the wheelhouse
        pip_args = [a.removeprefix("PIP_ARGS=") for a in build if a.startswith("PIP_ARGS=")]
        copied_to = re.search(r"^COPY \. (\S+)$", DOCKERFILE.read_text(), re.M).group(1)
        assert pip_args == ([f"--no-index --find-links {copied_to}/wheelhouse"] if offline else []), build


def test_the_scripts_that_hold_the_tokens_stay_out_of_the_repository_but_its_top(tmp_path):
    kit = _kit(tmp_path)
    script = str(kit / "tools" / "classroom.py")
    proc = _classroom(tmp_path, "--learners", "1", script=script, out=kit / "tools" / "start.sh")
    assert proc.returncode != 0 and "tokens" in proc.stderr and not (kit / "tools" / "start.sh").exists(), proc.stderr
    assert _classroom(tmp_path, "--learners", "1", script=script, out=kit / "start-classroom.sh").returncode == 0
    assert (kit / "stop-classroom.sh").exists()  # named after the start script, beside it (*.sh: .dockerignore)


def test_the_image_installs_the_repository_with_deepspeed_through_the_installer():
    text = DOCKERFILE.read_text()
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert "ARG BASE" in lines and lines.index("ARG BASE") < lines.index("FROM ${BASE}")  # no default: --build-arg
    copied_to = re.search(r"^COPY \. (\S+)$", text, re.M).group(1)  # the repository itself
    runs = [line for line in lines if line.startswith("RUN ")]
    npu = next(i for i, r in enumerate(runs) if "tools/install.py --npu" in r)  # the pair, for this machine
    kit = next(i for i, r in enumerate(runs) if "tools/install.py" in r and "--npu" not in r)
    assert npu < kit and all(f"-r {f}" in runs[kit] for f in ("requirements.txt", "requirements-deepspeed.txt"))
    assert all("${PIP_ARGS}" in runs[i] for i in (npu, kit)), runs
    assert f"WORKDIR {copied_to}" in lines[lines.index(f"COPY . {copied_to}"):lines.index(runs[npu])]


def _excluded(patterns: list[str], path: str) -> bool:
    """Docker's .dockerignore rule, enough for these patterns: a path is out when a pattern (`*` within one folder,
    `**` across folders) matches it or a folder above it; the last matching pattern decides (`!` takes back)."""
    out = False
    for pattern in patterns:
        keep = pattern.startswith("!")
        regex = re.escape(pattern.lstrip("!").strip("/")).replace(r"\*\*/", "(.*/)?").replace(r"\*", "[^/]*")
        parts = path.split("/")
        if any(re.fullmatch(regex, "/".join(parts[:i])) for i in range(1, len(parts) + 1)):
            out = not keep
    return out


def test_the_build_context_keeps_out_git_venvs_and_the_scripts_but_not_the_wheelhouse():
    patterns = [p.strip() for p in (Path(ROOT) / ".dockerignore").read_text().splitlines()
                if p.strip() and not p.startswith("#")]
    out = [".git/config", ".venv/bin/python", ".venv-py310/bin/python", "nbtools/__pycache__/floors.cpython-312.pyc",
           "accelerate_ascend_nbtools.egg-info/PKG-INFO", "nbtools-output/x/index.html", "notebooks/work/a.txt",
           "bench-out/r.json", ".pytest_cache/v", ".devrun/x", "start-classroom.sh", "stop-classroom.sh"]
    assert [p for p in out if not _excluded(patterns, p)] == []
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    kept = [*tracked, "wheelhouse/torch-2.9.0-cp312-cp312-manylinux_2_28_aarch64.whl", "wheelhouse/deepspeed.tar.gz"]
    assert len(tracked) > 50 and [p for p in kept if _excluded(patterns, p)] == []
    assert _excluded(["*.sh"], "a.sh") and not _excluded(["*.sh"], "tools/a.sh") and _excluded(["**/x"], "a/b/x/c")


def test_the_teaching_guides_classroom_commands_run_as_written_and_name_only_real_options(tmp_path):
    """docs/teaching.md, 2b: its tools/classroom.py and bash lines, run in order in a copy of the kit (the stand-in
    docker; this host's CPUs, memory and work folders replaced), and every --option it quotes is one of the script's
    own or one the written scripts pass on."""
    text = (Path(ROOT) / "docs" / "teaching.md").read_text(encoding="utf-8")
    text = text[text.index("## 2b "):text.index("\n## 3 ")]
    kit = _kit(tmp_path)
    (kit / "wheelhouse").mkdir()
    (kit / "wheelhouse" / "accelerate-1.15.0-py3-none-any.whl").write_bytes(b"")
    env, log = _docker(tmp_path)
    env.update(simnpu_env.environment(cards=8, environ=env))
    host = ["--host-cpus", str(HOST_CPUS), "--host-memory", f"{HOST_GIB}g", "--home", str(tmp_path / "home")]
    blocks = re.findall(r"```shell\n(.*?)```", text, re.S)
    lines = [line.split("  #")[0].strip() for b in blocks for line in b.replace("\\\n", " ").splitlines()]
    ran = []
    for line in lines:
        if line.startswith(("python3 tools/classroom.py", "bash ")):
            cmd = line.replace("python3", shlex.quote(sys.executable), 1) + " " + shlex.join(host) if "classroom.py" in line else line
            proc = subprocess.run(cmd, shell=True, cwd=kit, env=env, capture_output=True, text=True, timeout=60)
            assert proc.returncode == 0, (line, proc.stdout + proc.stderr)
            ran.append(line)
    assert sum("tools/classroom.py" in line for line in ran) == 3 and sum("bash " in line for line in ran) == 4, ran
    said = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True).stdout
    said += (kit / "start-classroom.sh").read_text() + (kit / "stop-classroom.sh").read_text()  # the last: --wheelhouse
    quoted = {flag for span in re.findall(r"`(--[^`]*)`", text) for flag in re.findall(r"(?<!\S)--[a-z][a-z-]*", span)}
    assert len(quoted) > 8 and sorted(f for f in quoted if not re.search(rf"(?<![\w-]){f}(?![\w-])", said)) == []
    assert set(re.findall(r"swr\.[^\s`]+", text)) == {floors.IMAGE}  # the wheelhouse's image: the quick-start's
    assert f"留 {classroom.RESERVE_CPUS} 核、{classroom.RESERVE_MIB // 1024} GiB" in text
    assert f"不到 {classroom.MIN_CPUS} 核或 {classroom.MIN_MIB // 1024} GiB" in text
