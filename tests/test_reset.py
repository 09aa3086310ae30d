"""`python -m nbtools reset` on a dirtied checkout: it stops nbtools' launches and removes the work folders,
and leaves everything else (other files, other processes) as it was."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import NOTEBOOKS, wait_gone
from packaging.requirements import Requirement

from nbtools.ps import accelerate_problem, accelerate_requirement


def _dirty_copy(tmp_path: Path) -> Path:
    notebooks = tmp_path / "notebooks"
    shutil.copytree(NOTEBOOKS, notebooks, ignore=shutil.ignore_patterns("work"))
    for stem in ("01_training", "03_big_model_inference"):
        (notebooks / "work" / stem).mkdir(parents=True)
        (notebooks / "work" / stem / "train_npu.py").write_text("print('a learner was here')\n")
    (notebooks / "my_notes.md").write_text("mine\n")
    return notebooks


@pytest.mark.alone
def test_reset_stops_launches_and_removes_work_folders_and_nothing_else(tmp_path):
    notebooks = _dirty_copy(tmp_path)
    hold = tmp_path / "hold_for_reset.py"
    hold.write_text("import time\ntime.sleep(600)\n")
    # a leftover launch nbtools started (guarded, marked), and a process of someone else's
    leftover = subprocess.Popen([sys.executable, "-m", "nbtools", "launch", "--num-processes", "1", "--device", "cpu",
                                 "--timeout", "300", str(hold)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    other = subprocess.Popen([sys.executable, str(hold)])
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(
            str(hold) in " ".join(p.cmdline()) for p in psutil.Process(leftover.pid).children(recursive=True)
        ):
            time.sleep(0.3)
        before = sorted(p.name for p in notebooks.iterdir())
        dry = subprocess.run([sys.executable, "-m", "nbtools", "reset", str(notebooks), "--dry-run"],
                             capture_output=True, text=True, timeout=120)
        assert dry.returncode == 0 and "would remove" in dry.stdout and "would stop them" in dry.stdout, dry.stdout
        assert (notebooks / "work" / "01_training" / "train_npu.py").exists() and leftover.poll() is None
        proc = subprocess.run([sys.executable, "-m", "nbtools", "reset", str(notebooks)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "did remove" in proc.stdout and "01_training, 03_big_model_inference" in proc.stdout, proc.stdout
        assert "did stop them" in proc.stdout, proc.stdout
        assert "is not a git checkout" in proc.stdout, proc.stdout  # a copy: said, nothing restored
        assert not (notebooks / "work").exists()
        assert sorted(p.name for p in notebooks.iterdir()) == [n for n in before if n != "work"]
        assert (notebooks / "my_notes.md").read_text() == "mine\n"
        leftover.wait(timeout=30)
        assert [p for p in wait_gone(str(hold)) if p.pid != other.pid] == []
        assert other.poll() is None, "reset stopped a process nbtools did not start"
    finally:
        for p in (leftover, other):
            if p.poll() is None:
                p.kill()
                p.wait()


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True, capture_output=True)


@pytest.mark.alone
def test_reset_puts_the_notebooks_back_as_committed_and_leaves_new_files(tmp_path):
    """A group edited a lesson (JupyterLab autosaves): the next group gets it as committed; a learner's own
    new notebook stays, and is named."""
    notebooks = tmp_path / "repo" / "notebooks"
    notebooks.mkdir(parents=True)
    shutil.copy(Path(NOTEBOOKS) / "00_environment.ipynb", notebooks)
    _git(notebooks.parent, "init", "-q")
    _git(notebooks.parent, "add", ".")
    _git(notebooks.parent, "commit", "-qm", "lessons")
    lesson = notebooks / "00_environment.ipynb"
    committed = lesson.read_text(encoding="utf-8")
    lesson.write_text(committed.replace("check-py", "check-py-edited-by-a-learner"), encoding="utf-8")
    mine = notebooks / "我的 笔记.ipynb"  # a space and Chinese letters: named as they are, not git-quoted or split
    mine.write_text("{}\n")
    dry = subprocess.run([sys.executable, "-m", "nbtools", "reset", str(notebooks), "--dry-run"],
                         capture_output=True, text=True, timeout=120)
    assert "would restore 1 edited notebook(s) as committed: 00_environment.ipynb" in dry.stdout, dry.stdout
    assert lesson.read_text(encoding="utf-8") != committed
    proc = subprocess.run([sys.executable, "-m", "nbtools", "reset", str(notebooks)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "did restore 1 edited notebook(s)" in proc.stdout, proc.stdout + proc.stderr
    assert lesson.read_text(encoding="utf-8") == committed
    assert mine.read_text() == "{}\n" and f"left alone (not part of the series, a learner's own?): {mine.name}" in proc.stdout


@pytest.mark.alone
def test_reset_lists_every_card_holder_and_kill_stops_it(tmp_path):
    """On the simulated NPU (its npu-smi lists who holds a card): a process nbtools did not start holds npu:0."""
    from nbtools import simnpu_env

    env = dict(os.environ, **simnpu_env.environment(), SIMNPU_STATE_DIR=str(tmp_path / "state"))
    holder = subprocess.Popen([sys.executable, "-c", "import time, torch; torch.zeros(1, device='npu:0'); "
                               "print('holding', flush=True); time.sleep(300)"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        notebooks = tmp_path / "notebooks"
        notebooks.mkdir()
        listed = subprocess.run([sys.executable, "-m", "nbtools", "reset", str(notebooks)], env=env,
                                capture_output=True, text=True, timeout=120)
        assert f"processes holding a card: {holder.pid} (--kill stops them)" in listed.stdout, listed.stdout
        assert holder.poll() is None
        dry = subprocess.run([sys.executable, "-m", "nbtools", "reset", str(notebooks), "--kill", "--dry-run"], env=env,
                             capture_output=True, text=True, timeout=120)
        assert f"processes holding a card: {holder.pid} (--kill would stop them)" in dry.stdout, dry.stdout
        assert holder.poll() is None
        killed = subprocess.run([sys.executable, "-m", "nbtools", "reset", str(notebooks), "--kill"], env=env,
                                capture_output=True, text=True, timeout=120)
        assert "stopped 1 of 1" in killed.stdout, killed.stdout
        assert holder.wait(timeout=30) == -signal.SIGTERM  # stopped politely, by reset
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def test_accelerate_is_judged_by_requirements_txt():
    requirement = accelerate_requirement()
    assert requirement.name == "accelerate" and str(requirement.specifier)
    assert accelerate_problem(requirement) is None  # the stack the README's command installed
    assert "outside requirements.txt's" in accelerate_problem(Requirement("accelerate<0.1"))


def test_a_source_install_of_accelerate_is_put_back(monkeypatch):
    """00's exercise installs Accelerate from a git tag: pip records that in direct_url.json."""

    class FromGit:
        version = "1.15.0"

        def read_text(self, name):
            return '{"url": "https://github.com/huggingface/accelerate.git", "vcs_info": {"vcs": "git"}}'

    from nbtools import ps

    monkeypatch.setattr(ps.metadata, "distribution", lambda name: FromGit())
    said = ps.accelerate_problem(accelerate_requirement())
    assert said == "Accelerate 1.15.0 was installed from https://github.com/huggingface/accelerate.git"


def test_reset_names_the_folder_the_interactive_work_folders_are_made_in(tmp_path, monkeypatch, capsys):
    """workdir.work_dir keeps a learner's work under <notebooks>/work/<stem>; reset removes that folder (a dry run
    here: it only says so)."""
    from nbtools import lang, ps, workdir

    monkeypatch.setenv(lang.SESSION_ENV, str(tmp_path / "01_training.ipynb"))
    made = workdir.work_dir(persistent=True, base=tmp_path)
    ps.reset(tmp_path, dry_run=True)
    assert f"would remove {made.parent} (1 work folder(s): 01_training)" in capsys.readouterr().out
