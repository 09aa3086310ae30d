"""`python -m nbtools ps [--kill]`: the launch processes nbtools started that are still alive.

Every process of a launch carries the variable ``NBTOOLS_LAUNCH=<launch id>:<starter pid>``
(set by the launcher, inherited by the guardian, ``accelerate launch`` and every rank), so
leftovers are found by that mark, not by guessing from command lines. ``--kill`` asks each
launch's guardian to stop its tree (SIGTERM, then SIGKILL after a grace period) and kills
whatever carries the mark and is still alive after that. Where ``npu-smi`` exists, its process
table is shown too (read by npusmi.py): the processes that hold an NPU right now, whoever started them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field

import psutil

from .guarded import GUARDIAN, MARKER_ENV
from .npusmi import parse_npu_smi, summary
from .proctree import existing, marked, stop_from_top


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


def stop(launches: list[Launch], grace: float | None = None) -> list[int]:
    """Stop every process of these launches (each guardian first: it stops its own tree gracefully);
    returns the pids still alive afterwards (none, normally)."""
    procs = existing(p.pid for launch in launches for p in launch.processes)
    guardians = {p.pid for launch in launches for p in launch.processes if p.role == "guardian"}
    tops = [proc for proc in procs if proc.pid in guardians]
    return stop_from_top(procs, tops, grace)


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


def main(kill: bool = False, out=print, wanted=()) -> int:
    """List (and with ``kill`` stop) the live launches; ``wanted``: only these ids / pids (default: all)."""
    launches = select(find(), wanted)
    out(render(launches))
    table = npu_smi_table()
    if table is not None:  # one line per chip, then who holds an NPU (as it came, in a layout the parser does not know)
        out("\nnpu-smi info (processes holding an NPU, whoever started them):\n" + (summary(table) if isinstance(table, dict) else table))
    if not kill or not launches:
        return 0
    if left := stop(launches):
        out(f"could not stop pid(s) {', '.join(map(str, left))} (another user's? try `kill -9` as that user)")
        return 1
    out(f"stopped {sum(len(g.processes) for g in launches)} process(es) of {len(launches)} launch(es)")
    return 0
