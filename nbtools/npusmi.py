"""Read the table `npu-smi info` prints: the NPUs (one row pair per chip) and the processes using them.

``parse_npu_smi(text)`` returns ``{"version": str | None, "npus": [...], "processes": [...]}``:

- ``npus``: one dict per chip row pair (on 910B cards one per NPU), with the header's columns under plain keys:
  ``id``, ``name``, ``health``, ``power_w``, ``temp_c``, ``hugepages_used``/``hugepages_total``, ``chip``,
  ``bus_id``, ``aicore_pct``, ``memory_used_mb``/``memory_total_mb``, ``hbm_used_mb``/``hbm_total_mb``
  (columns a card does not print are absent; ``-`` / ``NA`` give None);
- ``processes``: ``{"npu", "chip", "pid", "name", "memory_mb"}`` per process row; the
  ``No running processes found in NPU N`` rows give none.

``cards_seen(kind)``: how many cards a process here is given, told without torch (check-torch's expectation).

The parser reads the column names from the table's own header rows and splits cells on ``|``, so the
amount of spacing inside a row does not matter (``0    / 0`` and ``0 / 0`` read the same).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

_BUS_ID = re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]$")
_PAIR = re.compile(r"(\S+)\s*/\s*(\S+)")
_VERSION = re.compile(r"npu-smi\s+(\S+)")

# Header names as npu-smi prints them -> the keys of the parsed dicts, where _key's rule (lower case, `_` for each run
# of other characters: Bus-Id -> bus_id, Power(W) -> power_w) does not give them.
_KEYS = {"npu": "id", "hugepages-usage(page)": "hugepages", "aicore(%)": "aicore_pct", "memory-usage(mb)": "memory_mb",
         "hbm-usage(mb)": "hbm_mb"}
_PROC_KEYS = {"process id": "pid", "process name": "name", "process memory(mb)": "memory_mb"}


def _value(text: str):
    """'39' -> 39, '89.9' -> 89.9, '-' / 'NA' -> None, anything else stays a string."""
    text = text.strip()
    if text in ("", "-", "--", "NA", "N/A"):
        return None
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    return float(text) if re.fullmatch(r"-?\d+\.\d*", text) else text


def _key(header: str) -> str:
    h = header.strip().lower()
    return _KEYS.get(h) or re.sub(r"[^a-z0-9]+", "_", h).strip("_")


def _tokens(cell: str) -> list[str]:
    """Whitespace tokens of a cell, with ``used / total`` kept together as one ``used/total`` token."""
    return _PAIR.sub(r"\1/\2", cell).split()


def _record(header: list[list[str]], cells: list[str]) -> dict:
    """A row's values under its header's names, cell by cell (a cell's extra tokens go to its last name); a
    ``used/total`` usage column gives ``<key>_used`` and ``<key>_total`` (``hbm_used_mb``)."""
    record = {}
    for names, cell in zip(header, cells):
        toks = _tokens(cell)
        if len(toks) > len(names) and names:
            toks = toks[: len(names) - 1] + [" ".join(toks[len(names) - 1:])]
        for name, tok in zip(names, toks):
            key = _key(name)
            if "/" in tok and name.lower().endswith(")") and "usage" in name.lower():
                base, unit = (key[: -len("_mb")], "_mb") if key.endswith("_mb") else (key, "")
                record.update(zip((f"{base}_used{unit}", f"{base}_total{unit}"), map(_value, tok.split("/", 1))))
            else:
                record[key] = _value(tok)
    return record


def parse_npu_smi(text: str) -> dict:
    """Parse the output of ``npu-smi info``; raise ValueError when the text holds no NPU table header."""
    table = _Table()
    for line in map(str.strip, text.splitlines()):
        if line.startswith("|"):  # not separators (+----+, +====+) or anything around the table; `| a | b |`: a, b
            table.row([c.strip() for c in line.removeprefix("|").removesuffix("|").split("|")])
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
        self.npu: dict | None = None  # the last NPU row's own values

    def row(self, cells: list[str]) -> None:
        lowered = [c.lower() for c in cells]
        if self.version is None and self.section is None and (m := _VERSION.search(" ".join(cells))):
            self.version = m.group(1)
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
        if len(cells) >= 2 and _BUS_ID.match(cells[1]) and self.npu is not None:
            if "chip" in self.npus[-1]:  # a second chip of the same NPU: a new entry with the NPU's fields
                self.npus.append(dict(self.npu))
            self.npus[-1].update(_record(self.chip_header or [], cells))
        elif len(cells) >= 2 and cells[0]:
            self.npu = _record(self.npu_header, cells)
            self.npus.append(dict(self.npu))

    def _process(self, cells: list[str]) -> dict:
        first = _tokens(cells[0])
        proc: dict = {"npu": _value(first[0]) if first else None, "chip": _value(first[1]) if len(first) > 1 else None}
        for head, cell in zip(self.proc_header[1:], cells[1:]):
            key = _PROC_KEYS.get(head.lower(), _key(head))
            proc[key] = cell.strip() if key == "name" else _value(cell)
        return proc


def summary(table: dict) -> str:
    """A few lines a learner reads: one per NPU chip, then the processes (or that there are none)."""
    from .lang import msg  # here, not at the top: tools/classroom.py loads this module alone, by its path
    lines = []
    for n in table["npus"]:
        hbm = f"HBM {n.get('hbm_used_mb')} / {n.get('hbm_total_mb')} MB" if "hbm_total_mb" in n else ""
        lines.append(f"NPU {n.get('id')} chip {n.get('chip')}: {n.get('name')} health={n.get('health')} {hbm}".rstrip())
    lines += [msg("npusmi.process", pid=p.get("pid"), name=p.get("name"), npu=p.get("npu"), mb=p.get("memory_mb"))
              for p in table["processes"]] or [msg("npusmi.no_process")]
    return "\n".join(lines)


def cards_seen(kind: str, environ=None, dev: str = "/dev") -> int:
    """How many ``kind`` cards (npu / cuda) a process here is given, told without torch: the visibility variable
    where it is set, else the driver's device files (``/dev/davinciN``, ``/dev/nvidiaN``), else the vendor's table
    (``npu-smi info``, ``nvidia-smi -L``); 0 where there is none of them."""
    from .device import VISIBLE_VARS, listed_ids  # the visibility variables and their one reading

    environ, var = os.environ if environ is None else environ, VISIBLE_VARS[kind]
    stem, tool = {"npu": ("davinci", ["npu-smi", "info"]), "cuda": ("nvidia", ["nvidia-smi", "-L"])}[kind]
    if environ.get(var) is not None:
        return len(listed_ids(environ[var]))
    if files := [p for p in Path(dev).glob(stem + "*") if p.name[len(stem):].isdigit()]:
        return len(files)
    if (exe := shutil.which(tool[0], path=environ.get("PATH"))) is None:
        return 0
    text = subprocess.run([exe, tool[1]], capture_output=True, text=True, timeout=60, env=dict(environ)).stdout
    return len(parse_npu_smi(text)["npus"]) if kind == "npu" else sum(ln.startswith("GPU ") for ln in text.splitlines())
