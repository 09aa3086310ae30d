"""`python -m nbtools ps [--kill]`: the launch processes nbtools started that are still alive.

Every process of a launch carries the variable ``NBTOOLS_LAUNCH=<launch id>:<starter pid>``
(set by the launcher, inherited by the guardian, ``accelerate launch`` and every rank), so
leftovers are found by that mark, not by guessing from command lines. ``--kill`` asks each
launch's guardian to stop its tree (SIGTERM, then SIGKILL after a grace period) and kills
whatever carries the mark and is still alive after that. Where ``npu-smi`` exists, its process
table is shown too: the processes that hold an NPU right now, whoever started them.

Read the table `npu-smi info` prints: the NPUs (one row pair per chip) and the processes using them.

``parse_npu_smi(text)`` returns ``{"version": str | None, "npus": [...], "processes": [...]}``:

- ``npus``: one dict per chip row pair (on 910B cards one per NPU), with the header's columns under plain keys:
  ``id``, ``name``, ``health``, ``power_w``, ``temp_c``, ``hugepages_used``/``hugepages_total``, ``chip``,
  ``bus_id``, ``aicore_pct``, ``memory_used_mb``/``memory_total_mb``, ``hbm_used_mb``/``hbm_total_mb``
  (columns a card does not print are absent; ``-`` / ``NA`` give None);
- ``processes``: ``{"npu", "chip", "pid", "name", "memory_mb"}`` per process row; the
  ``No running processes found in NPU N`` rows give none.

The parser reads the column names from the table's own header rows and splits cells on ``|``, so the
amount of spacing inside a row does not matter (``0    / 0`` and ``0 / 0`` read the same).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field

import psutil

from .guarded import GUARD, MARKER_ENV
from .proctree import GRACE, marked, stop_from_top


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
        role = "guardian" if GUARD in cmd else "worker"
        groups[launch_id].processes.append(LaunchProcess(proc.pid, now - created, role, " ".join(cmd).replace("\n", " ")))
    for launch in groups.values():
        guardians = {p.pid for p in launch.processes if p.role == "guardian"}
        for p in launch.processes:
            try:
                if p.role == "worker" and psutil.Process(p.pid).ppid() in guardians:
                    p.role = "command"
            except psutil.Error:
                pass
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
        for p in g.processes:
            lines.append(f"  {p.pid:>7}  {_age(p.age_s):>7}  {p.role:<8}  {p.cmdline[: width - 30]}")
    n = sum(len(g.processes) for g in launches)
    lines.append(f"{len(launches)} launch(es) still running ({n} process(es)): `python -m nbtools ps --kill` stops them")
    return "\n".join(lines)


def stop(launches: list[Launch], grace: float = GRACE) -> list[int]:
    """Stop every process of these launches (each guardian first: it stops its own tree gracefully);
    returns the pids still alive afterwards (none, normally)."""
    procs, tops = [], []
    for launch in launches:
        for p in launch.processes:
            try:
                proc = psutil.Process(p.pid)
            except psutil.Error:
                continue
            procs.append(proc)
            if p.role == "guardian":
                tops.append(proc)
    return stop_from_top(procs, tops, grace)


def npu_processes(timeout: float = 20) -> str | None:
    """The process table of `npu-smi info`, or None where there is no npu-smi."""
    exe = shutil.which("npu-smi")
    if not exe:
        return None
    try:
        text = subprocess.run([exe, "info"], capture_output=True, text=True, timeout=timeout).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"npu-smi info failed: {exc}"
    try:
        return summary(parse_npu_smi(text))  # one line per chip, then who holds an NPU
    except ValueError:  # a layout the parser does not know: show it as it came
        return text.rstrip()


def select(launches: list[Launch], wanted=()) -> list[Launch]:
    """The launches named by id, by their starter's pid, or by the pid of any of their processes."""
    if not wanted:
        return launches
    keys = {str(w) for w in wanted}
    return [
        g
        for g in launches
        if g.id in keys or str(g.starter_pid) in keys or any(str(p.pid) in keys for p in g.processes)
    ]


def main(kill: bool = False, out=print, wanted=()) -> int:
    """List (and with ``kill`` stop) the live launches; ``wanted``: only these ids / pids (default: all)."""
    launches = select(find(), wanted)
    out(render(launches))
    table = npu_processes()
    if table is not None:
        out("\nnpu-smi info (processes holding an NPU, whoever started them):\n" + table)
    if not kill or not launches:
        return 0
    left = stop(launches)
    if left:
        out(f"could not stop pid(s) {', '.join(map(str, left))} (another user's? try `kill -9` as that user)")
        return 1
    out(f"stopped {sum(len(g.processes) for g in launches)} process(es) of {len(launches)} launch(es)")
    return 0


_BUS_ID = re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]$")
_PAIR = re.compile(r"(\S+)\s*/\s*(\S+)")
_VERSION = re.compile(r"npu-smi\s+(\S+)")

# Header names as npu-smi prints them -> the keys of the parsed dicts.
_KEYS = {
    "npu": "id",
    "name": "name",
    "health": "health",
    "power(w)": "power_w",
    "temp(c)": "temp_c",
    "hugepages-usage(page)": "hugepages",
    "chip": "chip",
    "bus-id": "bus_id",
    "aicore(%)": "aicore_pct",
    "memory-usage(mb)": "memory_mb",
    "hbm-usage(mb)": "hbm_mb",
}
_PROC_KEYS = {"process id": "pid", "process name": "name", "process memory(mb)": "memory_mb"}


def _value(text: str):
    """'39' -> 39, '89.9' -> 89.9, '-' / 'NA' -> None, anything else stays a string."""
    text = text.strip()
    if text in ("", "-", "--", "NA", "N/A"):
        return None
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if re.fullmatch(r"-?\d+\.\d*", text):
        return float(text)
    return text


def _key(header: str) -> str:
    h = header.strip().lower()
    return _KEYS.get(h) or re.sub(r"[^a-z0-9]+", "_", h).strip("_")


def _cells(line: str) -> list[str]:
    """The cells of a table row: ``| a | b |`` -> ['a', 'b'] (outer pipes dropped, inner text stripped)."""
    line = line.strip()
    if line.startswith("|"):
        line = line[1:]
    if line.endswith("|"):
        line = line[:-1]
    return [c.strip() for c in line.split("|")]


def _tokens(cell: str) -> list[str]:
    """Whitespace tokens of a cell, with ``used / total`` kept together as one ``used/total`` token."""
    return _PAIR.sub(r"\1/\2", cell).split()


def _fill(record: dict, names: list[str], cell: str) -> None:
    """Store the tokens of one cell under the header names of that cell (extra tokens go to the last name)."""
    toks = _tokens(cell)
    if len(toks) > len(names) and names:
        toks = toks[: len(names) - 1] + [" ".join(toks[len(names) - 1:])]
    for name, tok in zip(names, toks):
        key = _key(name)
        if "/" in tok and name.lower().endswith(")") and "usage" in name.lower():
            used, total = tok.split("/", 1)
            base = key[: -len("_mb")] if key.endswith("_mb") else key
            unit = "_mb" if key.endswith("_mb") else ""
            record[f"{base}_used{unit}"] = _value(used)
            record[f"{base}_total{unit}"] = _value(total)
        else:
            record[key] = _value(tok)


def parse_npu_smi(text: str) -> dict:
    """Parse the output of ``npu-smi info``; raise ValueError when the text holds no NPU table header."""
    table = _Table()
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("|"):  # not separators (+----+, +====+) or anything around the table
            table.row(_cells(line))
    if table.npu_header is None:
        raise ValueError("no `npu-smi info` table found: expected a header row with 'NPU', 'Name' and 'Health'")
    return {"version": table.version, "npus": table.npus, "processes": table.processes}


class _Table:
    """`npu-smi info`'s table, read row by row: the version line, the NPU section, the process section."""

    def __init__(self):
        self.version: str | None = None
        self.npu_header: list[list[str]] | None = None  # per cell: the column names of the NPU row
        self.chip_header: list[list[str]] | None = None  # per cell: the column names of the chip row
        self.proc_header: list[str] = []
        self.section: str | None = None  # None, "npu" or "proc"
        self.npus: list[dict] = []
        self.processes: list[dict] = []
        self.current: dict | None = None

    def row(self, cells: list[str]) -> None:
        joined = " ".join(cells)
        lowered = [c.lower() for c in cells]
        if self.version is None and self.section is None and _VERSION.search(joined):
            self.version = _VERSION.search(joined).group(1)
        elif "health" in lowered:
            self.npu_header, self.section = [c.split() for c in cells], "npu"
        elif self.section == "npu" and self.chip_header is None and "bus-id" in lowered:
            self.chip_header = [c.split() for c in cells]
        elif "process id" in lowered:
            self.proc_header, self.section = cells, "proc"
        elif self.section == "npu":
            self._npu_row(cells)
        elif self.section == "proc" and len(cells) >= 2 and not cells[0].lower().startswith("no running processes"):
            self.processes.append(self._process(cells))

    def _npu_row(self, cells: list[str]) -> None:
        if len(cells) >= 2 and _BUS_ID.match(cells[1]) and self.current is not None:
            chip: dict = {}
            for names, cell in zip(self.chip_header or [], cells):
                _fill(chip, names, cell)
            if "chip" in self.current:  # a second chip of the same NPU: a new entry with the NPU's fields
                self.current = {k: v for k, v in self.current.items() if k in _npu_keys(self.npu_header)}
                self.npus.append(self.current)
            self.current.update(chip)
        elif len(cells) >= 2 and cells[0]:
            self.current = {}
            for names, cell in zip(self.npu_header, cells):
                _fill(self.current, names, cell)
            self.npus.append(self.current)

    def _process(self, cells: list[str]) -> dict:
        first = _tokens(cells[0])
        proc: dict = {"npu": _value(first[0]) if first else None, "chip": _value(first[1]) if len(first) > 1 else None}
        for head, cell in zip(self.proc_header[1:], cells[1:]):
            key = _PROC_KEYS.get(head.lower(), _key(head))
            proc[key] = cell.strip() if key == "name" else _value(cell)
        return proc


def _npu_keys(npu_header) -> set[str]:
    keys = set()
    for names in npu_header or []:
        for name in names:
            k = _key(name)
            keys |= {k, f"{k}_used", f"{k}_total"}
    return keys


def summary(table: dict) -> str:
    """A few lines a learner reads: one per NPU chip, then the processes (or that there are none)."""
    lines = []
    for n in table["npus"]:
        hbm = f"HBM {n.get('hbm_used_mb')} / {n.get('hbm_total_mb')} MB" if "hbm_total_mb" in n else ""
        lines.append(f"NPU {n.get('id')} chip {n.get('chip')}: {n.get('name')} health={n.get('health')} {hbm}".rstrip())
    if table["processes"]:
        for p in table["processes"]:
            lines.append(f"  process {p.get('pid')} ({p.get('name')}) on NPU {p.get('npu')}: {p.get('memory_mb')} MB")
    else:
        lines.append("  no running processes")
    return "\n".join(lines)
