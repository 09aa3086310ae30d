"""``--simulate-npu``: kernels and launches see the simulated Ascend NPU of this repository's ``simnpu/``.

Nothing is installed and nothing else on the machine changes. The simulation's ``site/`` folder goes
in front of ``PYTHONPATH`` (torch then autoloads its stand-in ``torch_npu`` as it autoloads the real
one) and its ``bin/`` (the ``npu-smi`` stand-in) in front of ``PATH``; whatever the user's
environment already holds there stays behind them. ``SIMNPU_CARDS`` and ``SIMNPU_SOC`` describe the
simulated host; ``ASCEND_RT_VISIBLE_DEVICES``, when the user set it, selects among its cards as on a
real host. nbtools never imports the stand-in: the probe and the kernels do, in their own processes.

A simulated NPU proves code paths and wiring, never the hardware: every label says "NPU (simulated
on CPU)", and what only a real card can answer is skipped with the reason ``needs a real NPU``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from .decide import in_front
from .errors import ParameterError

SIMNPU_ROOT = Path(__file__).resolve().parent.parent / "simnpu"
# The cards a teacher can rehearse: the quick-start's 910B, and a 310P-like card without bf16.
SOCS = ("Ascend910B4", "Ascend310P3")
DEFAULT_SOC = SOCS[0]
DEFAULT_CARDS = 2



def environment(cards: int = DEFAULT_CARDS, soc: str = DEFAULT_SOC, environ: Mapping[str, str] | None = None, torch_npu: str | None = None) -> dict[str, str]:
    """The variables to set (on top of ``environ``, default os.environ) so that every process started
    from here sees ``cards`` simulated NPUs of type ``soc``, with torch_npu ``torch_npu``'s names."""
    environ = os.environ if environ is None else environ
    most = int((SIMNPU_ROOT / "csrc" / "simnpu.h").read_text().split("kMaxCards = ", 1)[1].split(";")[0])  # simnpu.h's
    if not isinstance(cards, int) or isinstance(cards, bool) or not 1 <= cards <= most:
        raise ParameterError(f"--npu-cards {cards!r}: expected a number of cards from 1 to {most}")
    if soc not in SOCS:
        raise ParameterError(f"--npu-soc {soc!r}: the simulation knows {', '.join(SOCS)}")
    if not (SIMNPU_ROOT / "site" / "torch_npu").is_dir():
        raise ParameterError(
            f"--simulate-npu needs the simulated NPU of this repository ({SIMNPU_ROOT} is missing): "
            "run from a checkout installed with `pip install -e .`"
        )
    if not os.access(SIMNPU_ROOT / "bin" / "npu-smi", os.X_OK):  # unpacked from a zip (python -m zipfile): no x bit
        (SIMNPU_ROOT / "bin" / "npu-smi").chmod(0o755)
    return {  # torch_npu 2.14.0: simnpu/site-2.14.0 (its dist-info, which the stand-in reads its release from) in front
        "PYTHONPATH": os.pathsep.join([*[str(SIMNPU_ROOT / f"site-{torch_npu}")] * (SIMNPU_ROOT / f"site-{torch_npu}").is_dir(), in_front(SIMNPU_ROOT / "site", environ.get("PYTHONPATH"))]),
        "PATH": in_front(SIMNPU_ROOT / "bin", environ.get("PATH")),
        "SIMNPU_CARDS": str(cards),
        "SIMNPU_SOC": soc,
        # what CANN's set_env.sh exports on a real host, and libraries read (DeepSpeed's NPU op builder)
        "ASCEND_HOME_PATH": str(SIMNPU_ROOT / "cann"),
    }


def prepare_simnpu(env: Mapping[str, str], python: str | None = None, timeout: float = 300) -> None:
    """Build the simulation's C++ device guard for this torch now (once; cached), so that no kernel or
    rank waits for it. Raises ParameterError with the build's own words when it cannot be built."""
    proc = subprocess.run(
        [python or sys.executable, "-c", "import torch, torch_npu; torch.npu.device_count()"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-12:])
        hint = ("\nfix: this torch sees a CUDA GPU, and torch_npu (the simulated one too) refuses to share a process "
                "with another accelerator: run with CUDA_VISIBLE_DEVICES= in front") if "Two accelerators" in tail else ""
        raise ParameterError(f"the simulated NPU does not load with this torch:\n{tail}{hint}")
