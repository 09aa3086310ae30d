"""`python -m nbtools doctor`: the setup against the quick-start's versions, each problem with its fix."""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from . import floors
from .device import CANN_FIX, DeviceInfo, detect
from .lang import msg
from .versions import installed, same_version

REQUIREMENTS_NPU = Path(__file__).resolve().parent.parent / "requirements-npu.txt"
REQUIREMENTS = REQUIREMENTS_NPU.with_name("requirements.txt")
COMPAT = Path(__file__).with_name("data") / "ascend_compat.json"  # Ascend's torch_npu / torch / CANN table, as read


def _lines(path: Path) -> list[str]:
    """A requirement file's lines; none when it is not there (an install that is not a checkout)."""
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []


def series_requirements(path: Path | None = None) -> dict[str, SpecifierSet]:
    """What requirements.txt asks of each package (``{"transformers": <SpecifierSet('<5.0,>=4.40')>}``)."""
    wanted = {}
    for line in _lines(path or REQUIREMENTS):
        line = line.split("#", 1)[0].strip()
        if line.startswith("-r "):  # requirements.txt reads requirements-learner.txt first
            wanted.update(series_requirements((path or REQUIREMENTS).parent / line[3:].strip()))
        elif line and not line.startswith("-"):
            req = Requirement(line)
            wanted[canonicalize_name(req.name)] = req.specifier
    return wanted


def quickstart_matrix(path: Path = REQUIREMENTS_NPU) -> dict[str, str]:
    """What the quick-start was validated with, read from requirements-npu.txt (its one copy):
    the ``name==version`` pins and the ``# quick-start: name version`` lines."""
    found = (re.match(r"#\s*quick-start:\s*(\S+)\s+(.+?)\s*()$", line) or re.match(r'([\w.-]+)==([^\s;]+)\s*(?:;\s*platform_machine\s*==\s*"(\w+)")?', line) for line in _lines(path))
    return {m.group(1).lower().replace("-", "_"): m.group(2) for m in found if m and m.group(3) in (None, "", platform.machine())}


QUICKSTART = quickstart_matrix()
# The one install (tools/install.py): the lessons' libraries around this Python's torch and torch_npu, held as they are.
INSTALL = "python tools/install.py  (in the series' folder; holds torch and torch_npu, brings no JupyterLab)"
OK, WARN, FAIL, INFO = "ok", "warn", "FAIL", "info"


@dataclass
class Row:
    what: str
    found: str
    status: str
    note: str = ""


def diagnose(info: DeviceInfo | None = None) -> list[Row]:
    info = info or detect()
    rows = [_python_row(info.versions["python"])]
    rows += [Row("setup", p.what, FAIL if p.blocking else WARN, p.fix) for p in info.problems]
    return rows + _torch_rows(info) + _pairing_rows(info) + [_devices_row(info)] + _package_rows() + _config_rows()


def _config_rows() -> list[Row]:
    """The default config file `accelerate launch` would read, where there is one, as Accelerate itself computes it:
    asked in a child process (its config module imports torch), default_config.yaml or default_config.json under
    HF_HOME/accelerate, whichever Accelerate picks."""
    code = "from accelerate.commands.config.config_args import default_config_file as f; print(f)"
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return []
    cfg = (proc.stdout.strip().splitlines() or [""])[-1] if proc.returncode == 0 else ""
    note = "your `accelerate launch` reads it; the series' launches ignore it (they pass Accelerate's defaults as --config_file)"
    return [Row("accelerate config", cfg, INFO, note)] if cfg and os.path.exists(cfg) else []


def _python_row(version: str) -> Row:
    if floors.below(version, floors.PYTHON):
        return Row("python", version, FAIL, f"below the series' minimum Python {floors.PYTHON}: see the setup line")
    if not version.startswith(f"{QUICKSTART.get('python')}."):
        return Row("python", version, INFO, f"the quick-start was validated with {QUICKSTART.get('python')}; "
                   f"Python {floors.PYTHON} or later works")
    return Row("python", version, OK)


def _torch_rows(info: DeviceInfo) -> list[Row]:
    """torch, torch_npu and CANN: installed, matching each other, and as the quick-start had them."""
    torch_v, npu_v = info.versions.get("torch"), info.versions.get("torch_npu")
    if not torch_v:
        rows = [Row("torch", "not installed", FAIL, "CPU: pip install torch; NPU: python tools/install.py --npu")]
    elif floors.below(torch_v, floors.TORCH):
        rows = [Row("torch", torch_v, FAIL, f"below the series' minimum torch {floors.TORCH}: see the setup line")]
    else:
        want = QUICKSTART.get("torch")
        status = WARN if npu_v and want and floors.release(torch_v)[:2] != floors.release(want)[:2] else OK
        rows = [Row("torch", torch_v, status, f"quick-start: {want}" if status != OK else "")]
    if npu_v and torch_v and floors.release(npu_v)[:2] != floors.release(torch_v)[:2]:
        rows.append(Row("torch_npu", npu_v, FAIL, f"torch_npu {npu_v} does not match torch {torch_v}: install the pair from the "
                        "torch / torch_npu / CANN compatibility matrix (https://gitcode.com/Ascend/pytorch)"))
    elif npu_v:
        want = QUICKSTART.get("torch_npu", "unknown")
        rows.append(Row("torch_npu", npu_v, OK if same_version(npu_v, want) else INFO, f"quick-start: {want}"))
    elif shutil.which("npu-smi"):
        rows.append(Row("torch_npu", "not installed", FAIL, "npu-smi is here but torch_npu is not: python tools/install.py --npu"))
    else:
        rows.append(Row("torch_npu", "not installed", INFO, "no Ascend NPU software here; the series runs on CUDA or CPU"))
    if info.kind == "npu":
        cann, want = cann_version(info) or "unknown", QUICKSTART.get("cann", "unknown")
        status = FAIL if floors.below(cann, floors.CANN) else OK if cann.startswith(want) else INFO
        rows.append(Row("CANN", cann, status, f"quick-start: {want}; the series' minimum: {floors.CANN}"))
    elif npu_v:
        rows.append(Row("CANN", "not loaded", WARN, CANN_FIX))
    return rows


def cann_version(info: DeviceInfo) -> str | None:
    """The CANN torch_npu loaded (torch.version.cann), else the one whose install info is under ASCEND_HOME_PATH (set by
    CANN's set_env.sh): an ``ascend_*_install.info`` with ``version=...``, where torch_npu's collect_env reads it."""
    home = Path(os.environ.get("ASCEND_HOME_PATH") or "/nonexistent")
    texts = (p.read_text(errors="replace") for depth in ("", "*/", "*/*/") for p in sorted(home.glob(f"{depth}ascend_*_install.info")))
    return info.versions.get("cann") or next((m.group(1) for t in texts if (m := re.search(r"^version=(\S+)", t, re.M))), None)


def pairing(cann: str | None, torch_npu: str | None) -> dict | None:
    """What Ascend's compatibility table (data/ascend_compat.json) says of this CANN and torch_npu, or None without a
    CANN: ``listed``, the [torch_npu, torch] it lists for that CANN (empty: no row); ``built_for``, the CANN(s) it lists
    this torch_npu for; ``together``, whether this torch_npu is one of ``listed``. Local labels (+simulated) are not compared."""
    if not cann:
        return None
    table, base, npu = json.loads(COMPAT.read_text(encoding="utf-8")), cann.split("+")[0], (torch_npu or "").split("+")[0]
    listed = [r[:2] for r in table["rows"] if f"{base.lower()}.".startswith(f"{r[2].lower()}.")]  # 9.1.0.1 is 9.1.0's
    return {"cann": cann, "torch_npu": npu or None, "listed": listed, "built_for": [r[2] for r in table["rows"] if r[0] == npu],
            "together": any(n == npu for n, _ in listed), "read": table["read"], "url": table["url"]}


def _pairing_rows(info: DeviceInfo) -> list[Row]:
    if not (p := pairing(cann_version(info), info.versions.get("torch_npu"))):
        return []  # no CANN here (a CPU or CUDA host): pairing does not apply
    said, npu, lists = f"Ascend's compatibility table (read {p['read']}, nbtools/data/ascend_compat.json)", p["torch_npu"], ", ".join(f"{n} (torch {t})" for n, t in p["listed"])
    built = "released together" if p["together"] else f"{npu} is the CANN {' / '.join(p['built_for'])} build" if p["built_for"] else f"{npu} is not in it" if npu else "no torch_npu here"
    return [Row("CANN pairing", f"CANN {p['cann']}, torch_npu {npu or '-'}", OK if p["together"] else INFO, f"{said}: {built}; for CANN "
                f"{p['cann']} it lists torch_npu {lists}; nothing was changed" if lists else f"{said} has no row for CANN {p['cann']}: see {p['url']}")]


def _devices_row(info: DeviceInfo) -> Row:
    if info.kind == "cpu":
        return Row("devices", "CPU only", INFO, "multi-process checks use the CPU gloo stand-in; NPU/CUDA paths are not checked here")
    if info.kind == "npu" and not info.bf16:  # the device's own answer (the probe's torch.npu.is_bf16_supported())
        return Row("devices", info.label, WARN, "this NPU has no bf16 (torch.npu.is_bf16_supported() is False): run bf16 "
                   "lessons with mixed_precision='no' or 'fp16'")
    if info.count >= 2:
        return Row("devices", info.label, OK)
    return Row("devices", info.label, WARN, "the 2-process checks need 2 devices; with 1 they fall back to the CPU (gloo)")


def _package_rows() -> list[Row]:
    rows, wanted = [], series_requirements()
    for pkg in ("accelerate", "transformers", "peft", "papermill", "nbclient", "ipykernel"):
        ver, spec = installed(pkg), wanted.get(pkg, SpecifierSet())
        if not ver:
            rows.append(Row(pkg, "not installed", FAIL, INSTALL))
        elif not spec.contains(ver, prereleases=True):
            rows.append(Row(pkg, ver, WARN, f"the requirement files ask for {pkg}{spec}: {INSTALL}"))
        else:
            rows.append(Row(pkg, ver, OK))
    if not installed("ipywidgets"):
        rows.append(Row("ipywidgets", "not installed", WARN, "JupyterLab shows a TqdmWarning box without it: pip install ipywidgets"))
    return rows


# What a terminal's `python` is and which torch / Accelerate it imports (each import may fail: that is the finding).
TERMINAL_PROBE = """import sys
print('python=', sys.version.split()[0]); print('executable=', sys.executable); print('prefix=', sys.prefix)
for name in ('torch', 'accelerate'):
    try:
        print(name + '=', __import__(name).__version__)
    except Exception as exc:
        print(name + '=', 'not importable:', type(exc).__name__)
"""


def terminal_python(path: str | None = None) -> tuple[dict, str]:
    """The first ``python`` on PATH (``path``: another PATH), what a terminal here runs, asked in its own process:
    ({python, executable, torch, accelerate}, problem). The problem, in the learner's language, is '' when it meets
    the series' Python floor and imports the torch and Accelerate this kernel has, whichever interpreter it is."""
    from .expected import parse_kv

    exe, fix = shutil.which("python", path=path), msg("doctor.fix_path", folder=Path(sys.executable).parent)
    if exe is None:
        return {}, msg("doctor.no_python", fix=fix)
    proc = subprocess.run([exe, "-c", TERMINAL_PROBE], capture_output=True, text=True, timeout=300)
    kv = parse_kv(proc.stdout)
    if floors.below(kv.get("python") or "0", floors.PYTHON):
        return kv, msg("doctor.old_python", exe=exe, version=kv.get("python", "?"), floor=floors.PYTHON, fix=fix)
    want = {name: installed(name) for name in ("torch", "accelerate")}
    if wrong := [n for n, v in want.items() if not same_version(kv.get(n), v)]:
        return kv, msg("doctor.other_stack", exe=exe, want=msg("list_sep").join(f"{n} {want[n]}" for n in wrong),
                       got=msg("sep").join(f"{n} {kv.get(n, '?')}" for n in wrong), fix=fix)
    return kv, ""


def render(rows: list[Row]) -> str:
    w = max(len(r.what) for r in rows)
    out = []
    for r in rows:
        line = f"[{r.status:>4}] {r.what:<{w}}  {r.found}"
        if r.note and len(line) + len(r.note) < 110:
            line += f"  ({r.note})"
        elif r.note:
            line += "\n" + " " * (w + 9) + ("fix: " if r.status in (FAIL, WARN) else "") + r.note
        out.append(line)
    blocking = [r for r in rows if r.status == FAIL]
    out += ["", f"{len(blocking)} blocking problem(s): fix the FAIL lines above, then run again." if blocking
            else "No blocking problem: `python -m nbtools run` can start."]
    return "\n".join(out)
