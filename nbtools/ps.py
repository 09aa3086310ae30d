"""`python -m nbtools ps [--kill]`: the launch processes nbtools started that are still alive.

Every process of a launch carries the variable ``NBTOOLS_LAUNCH=<launch id>:<starter pid>``
(set by the launcher, inherited by the guardian, ``accelerate launch`` and every rank), so
leftovers are found by that mark, not by guessing from command lines. ``--kill`` asks each
launch's guardian to stop its tree (SIGTERM, then SIGKILL after a grace period) and kills
whatever carries the mark and is still alive after that. Where ``npu-smi`` exists, its process
table is shown too (read by npusmi.py): the processes that hold an NPU right now, whoever started them.

`python -m nbtools reset`: a workshop machine back to its start state between two groups.

It does these things, says each one, and touches nothing else:

1. puts the series' notebooks back as committed (``git checkout`` of the edited ones; a learner's new
   files are listed, never touched);
2. stops the launches nbtools started that are still running (``ps --kill``: only processes that
   carry nbtools' launch mark, never a learner's other jobs or JupyterLab's kernels);
3. lists every process that holds a card (npu-smi's table), and with ``--kill`` stops them;
4. removes the work folders the notebooks made in JupyterLab (``notebooks/work/``, beside the
   notebooks; unattended runs already remove theirs);
5. puts back the Accelerate the requirement files ask for, where 00's exercise replaced it: an
   Accelerate installed from a source checkout or a git URL, or one outside ``requirements.txt``'s
   range, is reinstalled from the package index (or, offline, from ``--find-links WHEELHOUSE``).

``--dry-run`` says what it would do and does nothing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import psutil
from packaging.requirements import Requirement

from .doctor import REQUIREMENTS, series_requirements
from .guarded import GUARDIAN, MARKER_ENV
from .npusmi import parse_npu_smi
from .proctree import existing, is_alive, marked, stop_from_top, terminate_then_kill, tops
from .versions import direct_url
from .workdir import WORK


@dataclass
class LaunchProcess:
    pid: int
    age_s: float
    role: str  # guardian / command / worker
    cmdline: str


@dataclass
class Launch:
    id: str
    starter_pid: int
    starter_alive: bool
    processes: list[LaunchProcess] = field(default_factory=list)


def find() -> list[Launch]:
    """Every launch with a live process, except the one this process belongs to."""
    own = os.environ.get(MARKER_ENV)
    groups: dict[str, Launch] = {}
    now = time.time()
    for proc in marked(MARKER_ENV, lambda mark: mark != own):
        try:
            mark, cmd, created = proc.environ()[MARKER_ENV], proc.cmdline(), proc.create_time()
        except (psutil.Error, KeyError):
            continue
        launch_id, _, starter = mark.partition(":")
        starter_pid = int(starter) if starter.isdigit() else 0
        if launch_id not in groups:
            groups[launch_id] = Launch(launch_id, starter_pid, bool(starter_pid) and psutil.pid_exists(starter_pid))
        role = "guardian" if GUARDIAN in cmd else "worker"
        groups[launch_id].processes.append(LaunchProcess(proc.pid, now - created, role, " ".join(cmd).replace("\n", " ")))
    for launch in groups.values():
        guardians = {p.pid for p in launch.processes if p.role == "guardian"}
        for p in launch.processes:
            with contextlib.suppress(psutil.Error):
                if p.role == "worker" and psutil.Process(p.pid).ppid() in guardians:
                    p.role = "command"
        launch.processes.sort(key=lambda p: ("guardian", "command", "worker").index(p.role))
    return sorted(groups.values(), key=lambda g: -max(p.age_s for p in g.processes))


def _age(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def render(launches: list[Launch], width: int = 110) -> str:
    if not launches:
        return "no launch started by nbtools is running"
    lines = []
    for g in launches:
        who = "still running" if g.starter_alive else "GONE (kernel restarted or killed?)"
        lines.append(f"launch {g.id}: started by pid {g.starter_pid}, which is {who}")
        lines += [f"  {p.pid:>7}  {_age(p.age_s):>7}  {p.role:<8}  {p.cmdline[: width - 30]}" for p in g.processes]
    n = sum(len(g.processes) for g in launches)
    lines.append(f"{len(launches)} launch(es) still running ({n} process(es)): `python -m nbtools ps --kill` stops them")
    return "\n".join(lines)


def stop(launches: list[Launch]) -> list[int]:
    """Stop every process of these launches (each guardian first: it stops its own tree gracefully);
    returns the pids still alive afterwards (none, normally)."""
    procs = existing(p.pid for launch in launches for p in launch.processes)
    return stop_from_top(procs, tops(procs))  # the tops: the guardians (the kernel above one carries no mark)


def npu_smi_table(timeout: float = 20) -> dict | str | None:
    """`npu-smi info` read (npusmi.parse_npu_smi); its text when the layout is unknown or it failed; None where
    there is no npu-smi."""
    exe = shutil.which("npu-smi")
    if not exe:
        return None
    try:
        text = subprocess.run([exe, "info"], capture_output=True, text=True, timeout=timeout).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"npu-smi info failed: {exc}"
    try:
        return parse_npu_smi(text)
    except ValueError:  # a layout the parser does not know: show it as it came
        return text.rstrip()


def select(launches: list[Launch], wanted=()) -> list[Launch]:
    """The launches named by id, by their starter's pid, or by the pid of any of their processes."""
    if not wanted:
        return launches
    keys = {str(w) for w in wanted}
    return [g for g in launches if keys & {g.id, str(g.starter_pid), *(str(p.pid) for p in g.processes)}]


def accelerate_requirement() -> Requirement:
    """The ``accelerate`` line of requirements.txt (e.g. ``accelerate>=1.0``)."""
    wanted = series_requirements()
    if "accelerate" not in wanted:
        raise ValueError(f"{REQUIREMENTS} has no accelerate line")
    return Requirement(f"accelerate{wanted['accelerate']}")


def accelerate_problem(requirement: Requirement) -> str | None:
    """Why the installed Accelerate is not the one the requirement files give a learner; None when it is."""
    try:
        dist = metadata.distribution("accelerate")
    except metadata.PackageNotFoundError:
        return "Accelerate is not installed"
    if direct := direct_url("accelerate"):  # installed from a folder, a git URL or a file: 00's source install
        return f"Accelerate {dist.version} was installed from {direct.get('url', 'a local source')}"
    if not requirement.specifier.contains(dist.version, prereleases=True):
        return f"Accelerate {dist.version} is outside requirements.txt's {requirement}"
    return None


def reset(notebooks: Path | None = None, *, dry_run: bool = False, kill: bool = False, find_links: str | None = None,
          say=print) -> None:
    """Do (or, with ``dry_run``, list) the steps, saying each. ``kill``: also stop every process that holds a
    card (npu-smi's table), not only nbtools' launches."""
    from .runner import default_notebooks_dir

    verb = "would" if dry_run else "did"
    folder = notebooks or default_notebooks_dir()
    _restore_notebooks(folder, dry_run, say)
    if launches := find():
        say(f"launches still running ({len(launches)}):\n{render(launches)}")
        if not dry_run:
            stop(launches)
        say(f"{verb} stop them (guardian first, then SIGKILL whatever still carries nbtools' mark)")
    else:
        say("no launch of nbtools is running")

    _card_holders(kill, dry_run, say)
    work = folder / WORK
    if work.is_dir():
        folders = sorted(p.name for p in work.iterdir())
        if not dry_run:
            shutil.rmtree(work)
        say(f"{verb} remove {work} ({len(folders)} work folder(s): {', '.join(folders) or 'empty'})")
    else:
        say(f"no work folders ({work} does not exist)")

    requirement = accelerate_requirement()
    if (problem := accelerate_problem(requirement)) is None:
        say(f"Accelerate {metadata.version('accelerate')} is what requirements.txt asks for ({requirement}): left alone")
        return
    cmd = [sys.executable, "-m", "pip", "install", "--force-reinstall", "--no-deps", str(requirement)]
    if find_links:
        cmd[4:4] = ["--no-index", "--find-links", find_links]
    say(f"{problem}: {verb} reinstall it: {' '.join(cmd[1:])}")
    if not dry_run:
        subprocess.run(cmd, check=True)
        say(f"Accelerate is now {metadata.version('accelerate')}")


def _restore_notebooks(folder: Path, dry_run: bool, say) -> None:
    """The series' notebooks back as committed (git): a learner's edits and autosaves undone; new files left alone."""
    def git(*args: str) -> subprocess.CompletedProcess:  # -z: names with spaces or non-ASCII letters as they are
        return subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True)

    if shutil.which("git") is None or (edited := git("ls-files", "-z", "--modified", "--", "*.ipynb")).returncode != 0:
        say(f"{folder} is not a git checkout (or git is missing): the notebooks cannot be put back as committed "
            "(clone the repository again)")
        return
    names = sorted(set(filter(None, edited.stdout.split("\0"))))
    if names and not dry_run:
        git("checkout", "--", *names)
    say(f"{'would' if dry_run else 'did'} restore {len(names)} edited notebook(s) as committed: {', '.join(names)}"
        if names else "the notebooks are as committed")
    new = list(filter(None, git("ls-files", "-z", "--others", "--exclude-standard", "--", "*.ipynb").stdout.split("\0")))
    if new:
        say(f"left alone (not part of the series, a learner's own?): {', '.join(new)}")


def _card_holders(kill: bool, dry_run: bool, say) -> None:
    """Every process holding a card, whoever started it (npu-smi's table); stopped with ``kill`` (unless ``dry_run``)."""
    table = npu_smi_table()
    if not isinstance(table, dict):
        say("no npu-smi here: no card holders to list" if table is None else f"npu-smi: {table}")
        return
    pids = sorted({p["pid"] for p in table["processes"] if isinstance(p.get("pid"), int)})
    if not pids:
        say("no process holds a card")
        return
    say(f"processes holding a card: {', '.join(map(str, pids))}"
        + ("" if kill and not dry_run else " (--kill would stop them)" if kill else " (--kill stops them)"))
    if kill and not dry_run:
        killed = terminate_then_kill(existing(pids))
        alive = [p.pid for p in existing(pids) if is_alive(p)]
        say(f"stopped {len(pids) - len(alive)} of {len(pids)}" + (f" ({len(killed)} needed SIGKILL)" if killed else "")
            + (f"; still alive (another user's?): {alive}" if alive else ""))
