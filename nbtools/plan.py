"""How a real N-process group starts: the plan's data (``LaunchPlan``), the flags a plan decides (``PLAN_FLAGS``),
the CPU route's variables and flag (``cpu_route``), and the ranks on a card host's CPU kept off its cards
(``hide_cards``). ``DeviceInfo.plan`` (device.py) applies these rules to what the probe found."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .lang import msg


@dataclass
class LaunchPlan:
    """How to start a real ``num_processes`` group on this machine."""

    kind: str  # the device kind every rank will use: npu / cuda / cpu (as DeviceInfo.kind)
    num_processes: int
    backend: str | None  # the torch.distributed backend accelerate will report; None for one process (no group)
    distributed_type: str  # expected accelerate DistributedType name
    env: dict[str, str]  # variables to put in front of `accelerate launch`
    flags: list[str]  # `accelerate launch` flags (port and precision added by the launcher)
    devices: list[str]  # the torch devices the ranks use, e.g. ["npu:0", "npu:1"]
    fallback: bool = False  # True when the CPU (gloo) route stands in for missing accelerators
    note: str = ""
    # the collectives really run on torch's gloo: the CPU route, or the simulated NPU (its hccl is gloo underneath)
    gloo: bool = False
    why: list[str] = field(default_factory=list)  # why this route differs from the quick-start's NPU command
    mode: list[str] = field(default_factory=list)  # the route's own flags (--multi_gpu, --cpu), the first of flags
    route: str = ""  # what the route's variables and flags do (the CPU's: a real gloo group of N ranks)


# `accelerate launch` flags a plan decides, with the launcher's precision and port: written ones are replaced.
PLAN_FLAGS = frozenset({"--num_processes", "--num_machines", "--dynamo_backend", "--multi_gpu", "--cpu",
                        "--mixed_precision", "--main_process_port"})


def cpu_route(num_processes: int) -> tuple[dict[str, str], list[str], str]:
    """(variables, mode flag, what they do) that start ``num_processes`` ranks on a CPU. Only this
    combination gives a real multi-process group there (measured: ``--num_processes`` alone starts ONE
    process; ``--multi_gpu`` alone starts N processes that each run alone)."""
    if num_processes == 1:
        return {}, ["--cpu"], msg("plan.one_cpu")
    env, flags = {"ACCELERATE_USE_CPU": "1"}, ["--multi_gpu"]
    said = " + ".join([*(f"{k}={v}" for k, v in env.items()), *flags])
    return env, flags, msg("plan.gloo_group", said=said, n=num_processes)


# Put in front of PYTHONPATH for ranks that run on an NPU host's CPU (hide_cards), with torch's autoload off: a
# sitecustomize that marks torch_npu absent (None in sys.modules: importlib.util.find_spec answers None, as where it is
# not installed, so transformers, PEFT, Accelerate and DeepSpeed find no NPU and never import it), and a torch_npu that
# cannot be imported where sitecustomize does not run (python -S).
HIDDEN = {
    "sitecustomize.py": 'import sys\n\nsys.modules["torch_npu"] = None  # hidden from the CPU stand-in\'s ranks '
                        '(nbtools.plan.hide_cards)\n',
    "torch_npu/__init__.py": 'raise ImportError("torch_npu is hidden from the CPU stand-in\'s ranks '
                             '(nbtools.plan.hide_cards)")\n',
}


def write_files(folder: Path, files: dict[str, str], prefix: str) -> Path:
    """``files`` (name -> text) in ``folder``, each rewritten only where it differs, and whole (a process starting
    meanwhile never reads half a file); where ``folder`` is not writable, in a private temporary folder named
    ``prefix...``. The folder used (hide_cards, launcher.launch_config)."""
    try:
        _write(folder, files)
        return folder
    except OSError:
        private = Path(tempfile.mkdtemp(prefix=prefix))
        _write(private, files)
        return private


def _write(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = folder / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.with_suffix(f".{os.getpid()}").write_text(text, encoding="utf-8")
            os.replace(path.with_suffix(f".{os.getpid()}"), path)



def hide_cards(host: str) -> tuple[dict[str, str], str]:
    """(variables, what they do) that hide a ``host`` kind's cards from ranks run on its CPU. The cause: accelerate
    1.15's ``wait_for_everyone`` passes ``device_ids`` on MULTI_CPU too, and torch then builds that barrier on the
    host's accelerator ("No backend type associated with device type npu"; on CUDA "invalid device ordinal")."""
    if host == "cuda":
        return {"CUDA_VISIBLE_DEVICES": ""}, msg("plan.hide_gpu")
    if host != "npu":
        return {}, ""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "nbtools" / "hide-npu"
    folder = write_files(cache, HIDDEN, "nbtools-hide-npu-")
    return ({"PYTHONPATH": in_front(folder, os.environ.get("PYTHONPATH")), "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
            msg("plan.hide_npu"))


def in_front(entry: Path, current: str | None) -> str:
    """A PATH-like value with ``entry`` first and ``current`` (if any) after it."""
    return os.pathsep.join([str(entry), *([current] if current else [])])
