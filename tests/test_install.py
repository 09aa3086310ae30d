"""Installing never breaks the learner's image: README.zh-CN.md's install commands, run as written on stand-in images.

An image is stood in for by a venv of the Python it has, whose torch and torch_npu are metadata only (a
``.dist-info`` folder is all pip and importlib.metadata read) in a folder on PYTHONPATH, as an image's system
packages are outside the learner's venv. Two images:
- an old ModelArts-like one (Python 3.11, torch 2.5.1 + torch_npu 2.5.1): refused in one sentence, nothing
  installed; a plain `pip install -r requirements-learner.txt` there would replace its torch (the control);
- the quick-start's (Python 3.12, torch 2.9.0 + torch_npu 2.9.0.post2): installs, and keeps them.
A bare-metal Ascend host (no torch) is a venv of this Python, offline: `--npu` installs the pair from local indexes of
metadata-only wheels whose Requires-Dist is the real wheels' (x86_64: torch_npu asks for torch==2.9.0+cpu), the
machine stood in for by NBTOOLS_INSTALL_MACHINE.
The floors themselves are held to what CI runs (README's ci: commands).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path
from urllib.parse import quote

from conftest import ROOT, skip_outside_ci
from packaging.requirements import Requirement
from packaging.version import Version

from nbtools import floors

PAGE = Path(ROOT, "README.zh-CN.md").read_text(encoding="utf-8")
README = Path(ROOT, "README.md").read_text(encoding="utf-8")
OLD_IMAGE = {"torch": "2.5.1", "torch-npu": "2.5.1"}
QUICKSTART_IMAGE = {"torch": "2.9.0", "torch-npu": "2.9.0.post2"}


def page_block(way: str) -> str:
    """The shell block of 方式 A or 方式 B on the learner page, as written."""
    return re.search(rf"\*\*方式 {way}：.*?```shell\n(.*?)```", PAGE, re.S).group(1)


def interpreter(version: str) -> str:
    """A python<version> that runs: on PATH, or one of pyenv's (the README's way to get several)."""
    exe = shutil.which(f"python{version}")
    if exe and subprocess.run([exe, "-c", ""], capture_output=True).returncode == 0:
        return exe
    root = subprocess.run(["pyenv", "root"], capture_output=True, text=True).stdout.strip() if shutil.which("pyenv") else ""
    found = sorted(Path(root or "/nonexistent", "versions").glob(f"{version}.*/bin/python{version}"),
                   key=lambda p: Version(p.parts[-3]))
    if not found:
        skip_outside_ci(f"no python{version} here (pyenv install {version})")
    return str(found[-1])


def stand_in_image(tmp_path: Path, version: str, held: dict[str, str]) -> dict[str, str]:
    """The environment of a shell on that image: its `python` first on PATH, its torch family on PYTHONPATH."""
    venv, system = tmp_path / "image", tmp_path / "image-system-packages"
    subprocess.run([interpreter(version), "-m", "venv", str(venv)], check=True, timeout=300)
    for name, ver in held.items():
        info = system / f"{name.replace('-', '_')}-{ver}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {ver}\n")
        (info / "INSTALLER").write_text("image\n")
        (info / "RECORD").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON", "PIP_"))}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}", PYTHONPATH=str(system), PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


def versions(python: str, env: dict[str, str], *names: str) -> dict[str, str | None]:
    code = ("import json, sys; from importlib import metadata as m\n"
            "def v(n):\n try: return m.version(n)\n except m.PackageNotFoundError: return None\n"
            "print(json.dumps({n: v(n) for n in sys.argv[1:]}))")
    out = subprocess.run([python, "-c", code, *names], env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def shell(script: str, env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess:
    """A learner's terminal in the repository root, pasting the block."""
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_an_image_older_than_the_floors_is_refused_in_one_sentence_and_keeps_its_torch(tmp_path):
    env = stand_in_image(tmp_path, "3.11", OLD_IMAGE)
    venv_b = tmp_path / "learner-venv"
    for way, script in (("A", page_block("A")), ("B", page_block("B").replace("/home/ma-user/work/venv", str(venv_b)))):
        proc = shell(script, env)
        assert proc.returncode != 0, f"方式 {way} installed on torch 2.5.1:\n{proc.stdout[-2000:]}"
        said = [line for line in proc.stderr.splitlines() if "too old" in line]
        assert len(said) == 1 and "torch 2.5.1 (the series needs 2.9.0 or later)" in said[0], proc.stderr
        assert floors.IMAGE in said[0] and "tools/classroom.Dockerfile" in said[0], said
        python = str(venv_b / "bin" / "python") if way == "B" else "python"
        assert versions(python, env, *OLD_IMAGE, "accelerate") == {**OLD_IMAGE, "accelerate": None}, way


def test_without_the_held_versions_pip_would_replace_the_old_images_torch(tmp_path):
    """The control, and the learner page's claim: a plain install of the learner requirements on that image plans
    a new torch, because the Accelerate it picks (1.16.0 on Python >= 3.11) rejects torch 2.5.1. Only the file's
    accelerate line is resolved (the cause; the other lines' resolution took a minute more of the index)."""
    env = stand_in_image(tmp_path, "3.11", OLD_IMAGE)
    report = tmp_path / "plan.json"
    line = re.search(r"^accelerate\b.*$", Path(ROOT, "requirements-learner.txt").read_text(), re.M).group(0)
    proc = shell(f"python -m pip install -q --dry-run --report {report} '{line}'", env)
    if proc.returncode != 0:
        skip_outside_ci(f"pip could not resolve the learner requirements (no package index?): {proc.stderr[-400:]}")
    plan = {i["metadata"]["name"].lower(): i["metadata"] for i in json.loads(report.read_text())["install"]}
    assert "torch" in plan, "pip kept torch 2.5.1 unasked: the learner page's example is no longer true"
    wants = [Requirement(r) for r in plan["accelerate"].get("requires_dist", []) if Requirement(r).name == "torch"]
    assert wants and not any(r.specifier.contains(OLD_IMAGE["torch"]) for r in wants), (plan["accelerate"]["version"], wants)


NO_NETWORK = ("NewConnectionError", "Temporary failure in name resolution", "Network is unreachable", "No route to host")


def test_the_quickstart_image_installs_and_keeps_its_torch_and_torch_npu(tmp_path):
    # PIP_COMPILE=0 (pip's --no-compile): no .pyc for the installed libraries; what pip installs and keeps is the same
    env = {**stand_in_image(tmp_path, "3.12", QUICKSTART_IMAGE), "PIP_COMPILE": "0"}
    proc = shell(page_block("A"), env)
    if proc.returncode != 0 and any(s in proc.stderr for s in NO_NETWORK):
        skip_outside_ci(f"no package index: {proc.stderr[-400:]}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "held at their installed versions: torch 2.9.0, torch-npu 2.9.0.post2" in proc.stdout, proc.stdout[:600]
    got = versions("python", env, *QUICKSTART_IMAGE, "accelerate", "peft", "accelerate-ascend-nbtools", "jupyterlab")
    assert {k: got[k] for k in QUICKSTART_IMAGE} == QUICKSTART_IMAGE, got
    assert got["accelerate"] and got["peft"] and got["accelerate-ascend-nbtools"] and not got["jupyterlab"], got
    code = ("from importlib import metadata as m\nfor d in ('accelerate', 'peft'):\n"
            " print(*[r for r in m.requires(d) or [] if r.split(' ')[0].split('>')[0].split('=')[0] == 'torch'])")
    wants = [Requirement(r) for r in shell(f'python -c "{code}"', env).stdout.split() if r.startswith("torch")]
    assert wants and all(r.specifier.contains("2.9.0") for r in wants), wants  # releases that declare torch 2.9.0


def test_a_python_below_the_floor_hears_the_sentence_from_the_installer_and_the_doctor():
    python = interpreter("3.9")
    for argv in ([python, "tools/install.py"], [python, "-m", "nbtools", "doctor"]):
        proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert proc.returncode != 0 and "Traceback" not in proc.stderr, (argv, proc.stderr)
        assert re.search(r"python 3\.9\.\d+ \(the series needs 3\.10 or later\)", proc.stderr), proc.stderr
        assert floors.USE_INSTEAD in proc.stderr, proc.stderr


def test_the_floors_are_the_lowest_versions_ci_runs():
    """floors.py against the README's ci: commands (what CI runs), the requirement files and Accelerate itself."""
    commands = " ".join(re.findall(r"<!-- ci:[\w-]+ [^\n]*-->\n```shell\n(.*?)```", README, re.S))
    lowest = {name: min(re.findall(pattern, commands), key=Version)
              for name, pattern in (("python", r"\bpython(3\.\d+) -m venv"), ("torch", r"\btorch==([\d.]+)"),
                                    ("accelerate", r"\baccelerate==([\d.]+)"))}
    assert lowest == {"python": floors.PYTHON, "torch": floors.TORCH, "accelerate": floors.ACCELERATE}
    learner = Path(ROOT, "requirements-learner.txt").read_text()
    assert Version(re.search(r"^accelerate>=([\d.]+)", learner, re.M).group(1)) == Version(floors.ACCELERATE)
    npu = Path(ROOT, "requirements-npu.txt").read_text()
    assert re.search(r"^# quick-start: cann (\S+)", npu, re.M).group(1) == floors.CANN
    # 08's FSDP2: Accelerate 1.15 names its torch floor FSDP2_PYTORCH_VERSION; 1.16 requires that torch itself
    from importlib import metadata

    from accelerate.utils import constants

    needs = getattr(constants, "FSDP2_PYTORCH_VERSION", None) or next(
        min(s.version for s in Requirement(r).specifier) for r in metadata.requires("accelerate") if r.startswith("torch>"))
    assert Version(needs) <= Version(floors.TORCH), f"FSDP2 needs torch {needs}: 08 must skip below it"


LEARNER_FACING = sorted([*Path(ROOT, "notebooks").glob("*.ipynb"), *Path(ROOT, "docs").glob("*.md"),
                         Path(ROOT, "README.zh-CN.md")])


def test_no_notebook_or_doc_installs_a_requirement_file_past_the_installer():
    """A learner never installs requirements.txt (JupyterLab) into the platform's Python, nor a requirement file
    without tools/install.py holding the image's torch; a container's Dockerfile is no learner's page."""
    plain = re.compile(r"pip install[^\n`|]*?-r requirements(-learner|-deepspeed|-npu)?\.txt")
    found = [f"{p.name}: {m.group(0)}" for p in LEARNER_FACING for m in plain.finditer(p.read_text(encoding="utf-8"))]
    # a bare-metal host's torch pair (or the quick-start's image), and what the installer itself runs (-c <held>)
    allowed = [f for f in found if "requirements-npu.txt" in f or " -c " in f]
    assert sorted(set(found) - set(allowed)) == [], "use `python tools/install.py [-r ...]`"
    assert "python tools/install.py" in page_block("A") and "tools/install.py" in page_block("B")


def test_the_zip_route_unpacks_a_checkout_that_installs_and_simulates(tmp_path):
    """The learner page's zip route as written: the teacher's `git archive` (of HEAD), unpacked with Python's own
    zipfile (no unzip on the image), which drops executable bits: the checkout still installs (pip's dry run) and
    `--simulate-npu`'s npu-smi still runs."""
    teacher = re.search(r"`(git archive [^`]*)`", PAGE).group(1)
    subprocess.run(teacher.replace("-o accelerate-ascend.zip", f"-o {tmp_path / 'accelerate-ascend.zip'}"), shell=True,
                   cwd=ROOT, check=True, timeout=120)
    block = re.search(r"\*\*没有 git 或不能联网时：zip。\*\*.*?```shell\n(.*?)```", PAGE, re.S).group(1)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    after = (f"python tools/install.py --help > {tmp_path / 'help.txt'}\n"
             "python -c 'from nbtools import simnpu_env; print(simnpu_env.environment()[\"SIMNPU_CARDS\"])'\n"
             f"simnpu/bin/npu-smi info > {tmp_path / 'smi.txt'}\n")
    proc = shell(block.replace("/home/ma-user/work", str(tmp_path)) + after, env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Install the series into this Python" in (tmp_path / "help.txt").read_text()
    assert "npu-smi" in (tmp_path / "smi.txt").read_text(), (tmp_path / "smi.txt").read_text()


def _installer():
    import importlib.util

    spec = importlib.util.spec_from_file_location("install", Path(ROOT, "tools", "install.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_npu_brings_the_quickstarts_pair_or_the_torch_npu_of_the_torch_there():
    """--npu (examples-guards' setup_example.sh): nothing where torch_npu is there; where neither is, requirements-npu.txt's
    pair for the machine (x86_64: torch 2.9.0+cpu first, from PyTorch's CPU index) and requirements.txt; with torch
    alone, the torch_npu of that torch release (requirements-npu.txt's pin for the quick-start's torch)."""
    install = _installer()
    text = Path(ROOT, "requirements-npu.txt").read_text()
    pins = re.findall(r"^(torch|torch_npu)==(\S+?)(?:; platform_machine == \"(\w+)\")?$", text, re.M)
    assert pins == [("torch", "2.9.0", "aarch64"), ("torch", "2.9.0+cpu", "x86_64"), ("torch_npu", "2.9.0.post2", "")]
    assert {m: install.npu_pins(m) for m in ("x86_64", "aarch64")} == {
        "x86_64": {"torch": "2.9.0+cpu", "torch_npu": "2.9.0.post2"}, "aarch64": {"torch": "2.9.0", "torch_npu": "2.9.0.post2"}}
    series = ["-r", install.SERIES]
    cases = {((), "x86_64"): ("torch==2.9.0+cpu", ["torch_npu==2.9.0.post2", *series]),
             ((), "aarch64"): (None, ["torch==2.9.0", "torch_npu==2.9.0.post2", *series])}
    for machine in ("x86_64", "aarch64"):
        cases.update({(("2.9.0",), machine): (None, ["torch_npu==2.9.0.post2"]),
                      (("2.9.0+cpu",), machine): (None, ["torch_npu==2.9.0.post2"]),
                      (("2.8.0",), machine): (None, ["torch_npu==2.8.0.*"]),
                      (("2.9.0", "2.9.0.post9"), machine): (None, []), (("2.14.1", "2.14.0"), machine): (None, [])})
    for (versions, machine), want in cases.items():
        held = dict(zip(("torch", "torch-npu"), versions))
        assert install.npu_plan(held, floors, machine) == want, (held, machine)


def test_npu_on_an_image_with_torch_alone_installs_its_torch_npu_and_keeps_torch(tmp_path):
    """A stand-in image with the CPU torch 2.9.0+cpu and no torch_npu: pip plans torch_npu 2.9.0.post2 (its x86_64
    wheel asks for torch==2.9.0+cpu, its aarch64 wheel for torch==2.9.0) and no torch. (With PyPI's x86_64 torch
    2.9.0, which is no +cpu build, pip finds no torch_npu and tools/install.py says so in one sentence.)"""
    env = stand_in_image(tmp_path, "3.12", {"torch": "2.9.0+cpu"})
    proc = shell(f"python tools/install.py --npu --dry-run --report {tmp_path / 'plan.json'}", env)
    if proc.returncode != 0 and any(s in proc.stderr for s in NO_NETWORK):
        skip_outside_ci(f"no package index: {proc.stderr[-400:]}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "torch_npu missing, so also: torch_npu==2.9.0.post2" in proc.stdout, proc.stdout[-2000:]
    plan = json.loads((tmp_path / "plan.json").read_text())["install"]
    names = {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"] for i in plan}
    assert names.get("torch-npu") == "2.9.0.post2" and "torch" not in names, names
    assert versions("python", env, "torch", "torch-npu") == {"torch": "2.9.0+cpu", "torch-npu": None}


def _fake_wheel(index: Path, name: str, version: str, *requires: str) -> None:
    """A wheel of metadata only (all pip resolves and importlib.metadata reads) in a PEP 503 index folder, with the
    project's index.html listing what is there."""
    dist, project = f"{name}-{version}.dist-info", index / name.lower().replace("_", "-")
    files = {f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
             + "".join(f"Requires-Dist: {r}\n" for r in requires),
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{dist}/RECORD"] = "".join(f"{n},,\n" for n in [*files, f"{dist}/RECORD"])
    project.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(project / f"{name}-{version}-py3-none-any.whl", "w") as z:
        for n, text in files.items():
            z.writestr(n, text)
    links = "".join(f'<a href="{quote(w.name)}">{w.name}</a>\n' for w in sorted(project.glob("*.whl")))
    (project / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")


def bare_host(tmp_path: Path, machine: str) -> tuple[dict[str, str], Path, Path]:
    """A bare-metal Ascend host of ``machine`` with no torch, offline: a venv of this Python whose lessons' libraries are
    this test environment's (on PYTHONPATH, less torch and its CUDA wheels), a local "PyPI" holding PyPI's torch 2.9.0
    and torch_npu 2.9.0.post2 as that machine's wheel declares it (x86_64: torch==2.9.0+cpu), and a local "PyTorch CPU
    index" holding torch 2.9.0+cpu. Returns the shell's environment and the two index folders."""
    libs, pypi, cpu = tmp_path / "libs", tmp_path / "pypi", tmp_path / "pytorch-cpu"
    libs.mkdir()
    for site in {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}:
        for entry in Path(site).iterdir():
            if not re.match(r"(torch|functorch|triton|nvidia|distutils-precedence|__editable__)", entry.name, re.I):
                with contextlib.suppress(FileExistsError):
                    (libs / entry.name).symlink_to(entry)
    if not (libs / "setuptools").exists():
        skip_outside_ci("no setuptools in this environment: the stand-in host builds the series without an index")
    _fake_wheel(pypi, "torch", "2.9.0")
    _fake_wheel(pypi, "torch_npu", "2.9.0.post2", "torch==2.9.0+cpu" if machine == "x86_64" else "torch==2.9.0")
    _fake_wheel(cpu, "torch", "2.9.0+cpu")
    venv = tmp_path / "host"  # without pip: this environment's pip (on PYTHONPATH) installs into the venv
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON", "PIP_"))}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}", PYTHONPATH=str(libs), NBTOOLS_INSTALL_MACHINE=machine,
               PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_COMPILE="0")
    return env, pypi, cpu


def _install_npu(env: dict[str, str], pypi: Path, cpu: str) -> subprocess.CompletedProcess:
    return shell(f"python tools/install.py --npu --torch-index {cpu} --index-url {pypi.as_uri()} --no-build-isolation",
                 env, timeout=300)


def test_npu_on_a_bare_x86_64_host_installs_torch_cpu_from_pytorchs_index_then_torch_npu(tmp_path):
    """torch_npu 2.9.0.post2's x86_64 wheel requires torch==2.9.0+cpu, which PyPI's 2.9.0 does not satisfy (the control
    below): --npu installs 2.9.0+cpu from PyTorch's CPU index (here a local one) first, then torch_npu from PyPI."""
    env, pypi, cpu = bare_host(tmp_path, "x86_64")
    control = shell(f"python -m pip install --dry-run --index-url {pypi.as_uri()} torch==2.9.0 torch_npu==2.9.0.post2", env)
    assert control.returncode != 0 and "torch==2.9.0+cpu" in control.stdout + control.stderr, control.stdout + control.stderr
    proc = _install_npu(env, pypi, cpu.as_uri())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"-m pip install --index-url {cpu.as_uri()} torch==2.9.0+cpu\n" in proc.stdout, proc.stdout[:1500]
    assert "held at their installed versions: torch 2.9.0+cpu\n" in proc.stdout, proc.stdout[:1500]
    assert "torch_npu missing, so also: torch_npu==2.9.0.post2 -r " in proc.stdout, proc.stdout[:1500]
    assert versions("python", env, "torch", "torch-npu") == {"torch": "2.9.0+cpu", "torch-npu": "2.9.0.post2"}


def test_npu_on_a_bare_aarch64_host_installs_pypis_torch(tmp_path):
    """aarch64: torch_npu's wheel requires torch==2.9.0; --npu installs PyPI's, never asking PyTorch's index (whose
    2.9.0+cpu would win a plain ==2.9.0: a local label sorts after the public version)."""
    env, pypi, cpu = bare_host(tmp_path, "aarch64")
    proc = _install_npu(env, pypi, cpu.as_uri())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "torch_npu missing, so also: torch==2.9.0 torch_npu==2.9.0.post2 -r " in proc.stdout, proc.stdout[:1500]
    assert cpu.as_uri() not in proc.stdout and "held at their installed versions: nothing" in proc.stdout, proc.stdout
    assert versions("python", env, "torch", "torch-npu") == {"torch": "2.9.0", "torch-npu": "2.9.0.post2"}


def test_npu_on_an_x86_64_host_that_cannot_reach_pytorchs_index_says_the_command_in_one_sentence(tmp_path):
    env, pypi, cpu = bare_host(tmp_path, "x86_64")
    proc = _install_npu(env, pypi, (tmp_path / "unreachable").as_uri())
    said = [line for line in proc.stderr.splitlines() if line.startswith("tools/install.py:")]
    assert proc.returncode == 1 and len(said) == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "`python -m pip install torch==2.9.0+cpu --index-url https://download.pytorch.org/whl/cpu`" in said[0], said
    assert "then run `python tools/install.py --npu` again" in said[0], said
    assert versions("python", env, "torch", "torch-npu") == {"torch": None, "torch-npu": None}


def test_npu_on_a_machine_requirements_npu_has_no_torch_for_installs_nothing_and_says_so(tmp_path):
    env, pypi, cpu = bare_host(tmp_path, "arm64")  # macOS' name; requirements-npu.txt names x86_64 and aarch64
    proc = _install_npu(env, pypi, cpu.as_uri())
    assert proc.returncode == 1 and "$ " not in proc.stdout and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert proc.stderr.strip().endswith("this machine is arm64."), proc.stderr
