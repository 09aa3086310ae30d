"""Device detection, and only that: what this machine is (the probe, its cache, ``DeviceInfo``).

The probe runs in a child Python process, for three reasons:
- a broken torch_npu (installed without CANN) makes ``import torch`` itself raise;
  the child absorbs that and we report it with its fix instead of crashing;
- initialising an NPU in the notebook kernel breaks ``notebook_launcher``'s fork
  later ("Cannot re-initialize NPU in forked subprocess");
- tests can substitute the probe's answers (``detect(probe=...)``) to exercise the
  NPU and CUDA branches on a CPU-only machine.

What a launch does with it (the route, the parameter and precision rules) is decide.py's; installed versions
versions.py's; the simulated NPU's variables simnpu_env.py's.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import floors
from .versions import installed

VISIBLE_VARS = {"npu": "ASCEND_RT_VISIBLE_DEVICES", "cuda": "CUDA_VISIBLE_DEVICES"}  # the cards a process may use
BACKENDS = {"npu": "hccl", "cuda": "nccl", "cpu": "gloo"}
DISTRIBUTED_TYPES = {"npu": "MULTI_NPU", "cuda": "MULTI_GPU", "cpu": "MULTI_CPU"}
# CANN's environment script. CANN 8.5 and later (the quick-start's 9.1.0 among them) install to
# /usr/local/Ascend/cann/, older releases to /usr/local/Ascend/ascend-toolkit/ (kept as a compatibility path);
# the installer records its folder in /etc/Ascend/ascend_cann_install.info (`Install_Path=...`). The official
# CANN images export the variables themselves.
CANN_SET_ENV = "/usr/local/Ascend/cann/set_env.sh"
CANN_SET_ENV_OLD = "/usr/local/Ascend/ascend-toolkit/set_env.sh"
CANN_INSTALL_INFO = "/etc/Ascend/ascend_cann_install.info"


def cann_set_env(install_info: str | os.PathLike = CANN_INSTALL_INFO, root: str = "/usr/local/Ascend") -> str | None:
    """This machine's CANN set_env.sh: under the folder the installer recorded, else under ``root``; the new
    layout (``cann/``) before the old one (``ascend-toolkit/``). None when there is none."""
    try:
        lines = Path(install_info).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        lines = []
    roots = [line.split("=", 1)[1].strip() for line in lines if line.strip().startswith("Install_Path=")]
    candidates = (Path(base) / sub / "set_env.sh" for base in (*roots, root) for sub in ("", "cann", "ascend-toolkit"))
    return next((str(c) for c in candidates if c.is_file()), None)


_WHERE = (f"{CANN_SET_ENV} (CANN 8.5 and later; older releases: {CANN_SET_ENV_OLD}; "
          f"`cat {CANN_INSTALL_INFO}` or `ls /usr/local/Ascend` shows where CANN is)")
CANN_FIX = (f"source {cann_set_env() or _WHERE} before starting Python/JupyterLab, then restart the kernel; if CANN is "
            "not installed, install the CANN toolkit matching torch_npu "
            "(https://ascend.github.io/docs/sources/ascend/quick_install.html)")

# Runs in a child interpreter; prints one JSON object.
_PROBE = r"""
import json, sys
out = {"python": sys.version.split()[0]}
try:  # the kernel's IPython: 8 (Python 3.10) and 9 transform cells differently
    from importlib.metadata import version
    out["ipython"] = version("ipython")
except Exception:
    pass
try:
    import torch
    out["torch"] = torch.__version__
except BaseException as exc:
    out["torch_error"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(out)); sys.exit(0)
try:
    import torch_npu
    out["torch_npu"] = getattr(torch_npu, "__version__", "unknown")
    out["cann"] = getattr(getattr(torch, "version", None), "cann", None)
    # A simulated NPU (simnpu/, `nbtools run --simulate-npu`) marks its version "+simulated"
    out["npu_simulated"] = "+simulated" in out["torch_npu"]
    out["npu_available"] = bool(torch.npu.is_available())
    n = torch.npu.device_count() if out["npu_available"] else 0
    out["npu_count"] = n
    out["npu_names"] = [torch.npu.get_device_name(i) for i in range(n)]
    if n:  # Accelerate's is_bf16_available() says True on any NPU; this is the device's own answer
        out["npu_bf16"] = bool(torch.npu.is_bf16_supported())
except ModuleNotFoundError:
    pass
except BaseException as exc:
    out["torch_npu_error"] = f"{type(exc).__name__}: {exc}"
try:
    out["cuda_available"] = bool(torch.cuda.is_available())
    n = torch.cuda.device_count() if out["cuda_available"] else 0
    out["cuda_count"] = n
    out["cuda_names"] = [torch.cuda.get_device_name(i) for i in range(n)]
    out["cuda_bf16"] = bool(n and torch.cuda.is_bf16_supported())
except BaseException as exc:
    out["cuda_error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


@dataclass
class Problem:
    """Something wrong with the setup, and what to do about it."""

    what: str
    fix: str
    blocking: bool = True


def cache_root() -> Path:
    """nbtools' cache folder, the one (the probe's answers, the hidden-cards shim): $XDG_CACHE_HOME/nbtools, else ~/.cache."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "nbtools"


def listed_ids(value: str | None) -> list[str]:
    """The card numbers a visibility variable's value lists (ASCEND_RT_VISIBLE_DEVICES=0,1 -> ["0", "1"])."""
    return [x.strip() for x in (value or "").split(",") if x.strip()]


@dataclass
class DeviceInfo:
    kind: str  # npu / cuda / cpu: the best accelerator usable here
    count: int
    names: list[str]
    versions: dict[str, str | None]
    visible_var: str | None
    visible_devices: str | None
    problems: list[Problem] = field(default_factory=list)
    bf16: bool = True  # bf16 supported on this device kind
    simulated: bool = False  # an NPU simulated on the CPU (simnpu/): code paths and wiring, never the hardware
    raw: dict = field(default_factory=dict)

    @property
    def backend(self) -> str:
        return BACKENDS[self.kind]

    @property
    def healthy(self) -> bool:
        return not any(p.blocking for p in self.problems)

    @property
    def mixed_precisions(self) -> tuple[str, ...]:
        """The --mixed_precision values a launch on this device takes (decide.precisions_on, the one rule)."""
        from .decide import precisions_on  # decide.py reads this module: imported when asked

        return precisions_on(self.kind, self.bf16)

    def versions_line(self) -> str:
        v = self.versions
        return "versions: " + ", ".join(
            f"{k} {v[k]}" for k in ("python", "ipython", "torch", "torch_npu", "cann", "accelerate", "transformers") if v.get(k)
        )

    @property
    def label(self) -> str:
        return device_label(self.kind, self.count, self.names, self.simulated)

    @property
    def real_npu(self) -> bool:
        """An Ascend NPU that is hardware, not the simulation: what only a real card can answer needs this."""
        return self.kind == "npu" and not self.simulated

    def summary(self) -> str:
        parts = [f"device: {self.label}, backend {self.backend}", self.versions_line()]
        return "\n".join([*parts, *(f"PROBLEM: {p.what}\n  fix: {p.fix}" for p in self.problems)])

    def to_dict(self) -> dict:
        d = asdict(self)
        d["backend"] = self.backend
        d.pop("raw", None)
        if self.simulated:  # the simulated host it ran on (cards, SoC, a test fault): another host is another answer
            d["simnpu"] = {k: v for k, v in sorted(os.environ.items()) if k.startswith("SIMNPU_")}
        return d


SIMULATED = "NPU (simulated on CPU)"


def device_label(kind: str, count: int, names=(), simulated: bool = False) -> str:
    """'CPU only (no NPU/CUDA visible)', 'NPU x2 (Ascend910B4)' or 'NPU (simulated on CPU) x2 (Ascend910B4)':
    one label for the CLI and every report."""
    if kind == "cpu":
        return "CPU only (no NPU/CUDA visible)"
    unique = ", ".join(sorted(set(names or [])))
    head = SIMULATED if kind == "npu" and simulated else kind.upper()
    return f"{head} x{count}" + (f" ({unique})" if unique else "")


def device_line(device: dict) -> str:
    """The same label from report.json's ``device`` (DeviceInfo.to_dict): report.md, junit.xml, index.html."""
    return device_label(device.get("kind", "?"), device.get("count", 0), device.get("names"), device.get("simulated", False))


def run_probe(python: str | None = None, timeout: float = 120, env: dict[str, str] | None = None) -> dict:
    """Run the probe in a child interpreter (``env``: its whole environment; default this one's) and return its answers."""
    env = dict(os.environ if env is None else env)
    try:
        proc = subprocess.run([python or sys.executable, "-c", _PROBE], capture_output=True, text=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"probe_error": f"the device probe did not answer within {timeout:.0f} s (hung driver?)"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        return {"probe_error": f"the device probe exited {proc.returncode}: " + " | ".join(tail)}
    return json.loads(lines[-1])


def from_probe(probe: dict, environ: dict | None = None) -> DeviceInfo:
    """Build a DeviceInfo from probe answers (real or substituted in tests)."""
    environ = os.environ if environ is None else environ
    versions = {
        "python": probe.get("python") or sys.version.split()[0],
        "ipython": probe.get("ipython") or installed("ipython"),
        "torch": probe.get("torch") or installed("torch"),
        "torch_npu": probe.get("torch_npu") or installed("torch-npu") or installed("torch_npu"),
        "cann": probe.get("cann"),
        "accelerate": installed("accelerate"),
        "transformers": installed("transformers"),
    }
    problems: list[Problem] = []
    err = probe.get("torch_error") or probe.get("torch_npu_error") or probe.get("probe_error")
    if err:
        npu_related = "torch_npu" in err or "libhccl" in err or "libascend" in err or "Ascend" in err
        if npu_related or probe.get("torch_npu_error"):
            problems.append(Problem(f"torch_npu is installed but cannot load: {err}", CANN_FIX))
        elif probe.get("torch_error"):
            problems.append(Problem(f"import torch failed: {err}", "install torch (CPU/CUDA: `pip install torch`; "
                                    "NPU: the torch matching torch_npu, see requirements-npu.txt)"))
        else:
            problems.append(Problem(err, "run `python -m nbtools doctor` for details"))
    if short := floors.shortfall(versions):  # below the series' floors: every setup cell stops with what to use instead
        problems.append(Problem(f"too old for the series: {short}", floors.USE_INSTEAD))
    kind, count, names, simulated = "cpu", 0, [], False
    if probe.get("npu_available") and probe.get("npu_count", 0) > 0:
        kind, count, names = "npu", probe["npu_count"], list(probe.get("npu_names") or [])
        simulated = bool(probe.get("npu_simulated"))
    elif probe.get("cuda_available") and probe.get("cuda_count", 0) > 0:
        kind, count, names = "cuda", probe["cuda_count"], list(probe.get("cuda_names") or [])
    elif versions["torch_npu"] and not err and probe.get("torch_npu"):
        problems.append(Problem("torch_npu imports but sees no NPU (torch.npu.is_available() is False)",
                                "check `npu-smi info`, the device mounts of your container (/dev/davinci*), "
                                "and ASCEND_RT_VISIBLE_DEVICES; the series falls back to the CPU meanwhile",
                                blocking=False))
    var, bf16 = VISIBLE_VARS.get(kind), bool(probe.get(f"{kind}_bf16", True))  # the device's own answer (no 310P has)
    return DeviceInfo(kind=kind, count=count, names=names, versions=versions, visible_var=var,
                      visible_devices=environ.get(var) if var else None, problems=problems, bf16=bf16,
                      simulated=simulated, raw=dict(probe))


_CACHE: dict[tuple, DeviceInfo] = {}
CACHE_ENV = "NBTOOLS_DEVICE_PROBE"  # JSON probe answers handed down by the runner
# What the probe's answers depend on: the interpreter, what is installed, and the variables
# that decide which devices and which CANN libraries a process sees.
_PROBE_KEY_VARS = ("LD_LIBRARY_PATH", "ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH", "TORCH_DEVICE_BACKEND_AUTOLOAD", "PYTHONPATH",
                   # the simulated NPU's host (simnpu/): another card or count is another answer
                   "SIMNPU_CARDS", "SIMNPU_SOC", "SIMNPU_FAULT")
PROBE_CACHE_TTL_S = 600.0


def cached_probe(python: str | None = None, refresh: bool = False) -> dict:
    """The probe's answers, from a fresh child process at most every PROBE_CACHE_TTL_S seconds.

    A probe imports torch (seconds); `python -m nbtools launch` would pay that at every call.
    Answers that report a problem are never cached: a fix (e.g. sourcing CANN's set_env.sh)
    shows at the next call.
    """
    python = python or sys.executable
    key = json.dumps([os.path.realpath(python),  # what the answers depend on
                      [installed(n) for n in ("torch", "torch-npu", "torch_npu")] if python == sys.executable else [],
                      [os.environ.get(v) for v in (*VISIBLE_VARS.values(), *_PROBE_KEY_VARS)]])
    path = cache_root() / f"probe-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
    if not refresh:
        with contextlib.suppress(OSError, ValueError):
            if time.time() - path.stat().st_mtime < PROBE_CACHE_TTL_S:
                return json.loads(path.read_text())
    answers = run_probe(python)
    if not any(k.endswith("_error") for k in answers):
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(answers))
            os.replace(tmp, path)
    return answers


def detect(probe: dict | None = None, refresh: bool = False) -> DeviceInfo:
    """Tell what this machine is. Never raises: problems are listed in ``.problems``."""
    if probe is not None:
        return from_probe(probe)
    key = (sys.executable, *(os.environ.get(v) for v in (*VISIBLE_VARS.values(), *_PROBE_KEY_VARS)))
    if refresh or key not in _CACHE:
        try:  # the runner's answers, handed down
            answers = None if refresh else json.loads(os.environ.get(CACHE_ENV) or "null")
        except ValueError:
            answers = None
        _CACHE[key] = from_probe(answers if answers is not None else cached_probe(refresh=refresh))
    return _CACHE[key]
