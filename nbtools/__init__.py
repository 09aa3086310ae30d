"""nbtools: the plumbing behind the Accelerate-on-Ascend notebook series.

The learner-facing API: ``nbtools.setup`` (session.py) and the ``%cmd`` / ``%%cmd`` /
``%launch`` magics (magics.py, rules in commands.py) after ``%load_ext nbtools``.

Four parts, each importing only its own and those before it (README, "nbtools: the plumbing"):
core (device, params, checks, proctree, npusmi), launch (session, magics, commands, launcher,
guarded, diagnose, guardian, machines), run (runner, kernels, report, lint, answers, ps, doctor) and the
lessons' helpers (bigmodel, ranks). Importing this package never imports torch.
"""

import sys

from . import floors

# Below the series' Python floor nothing else is imported: one sentence says what to use instead (floors.py).
# `python -m nbtools ...` (argv[0] is "-m" while the package loads) gets it without a traceback.
_TOO_OLD = floors.refusal({"python": ".".join(map(str, sys.version_info[:3]))})
if _TOO_OLD:
    raise (SystemExit if sys.argv[:1] == ["-m"] else ImportError)("nbtools: " + _TOO_OLD)

from .checks import SEED_CHECKS, passed, skipped
from .commands import CommandNotHere
from .decide import LaunchSpec, plan, validate
from .device import DeviceInfo, detect
from .diagnose import CommandResult
from .errors import DeviceError, LaunchError, LaunchTimeout, NbtoolsError, OutputMismatch, ParameterError
from .expected import assert_matches, match, parse_kv
from .guarded import LaunchOptions, accelerate_launch, free_port, run_command
from .session import Session, setup
from .versions import editable, installed, public_version, same_version
from .workdir import cleanup, work_dir

__version__ = "0.1.0"


def load_ipython_extension(ip):
    """``%load_ext nbtools``: register the magics that run a learner's commands (magics.py)."""
    from .magics import register

    register(ip)


__all__ = [  # what a notebook reaches as nbtools.*
    "setup", "Session", "detect", "DeviceInfo", "validate", "work_dir", "cleanup", "plan", "LaunchSpec",
    "run_command", "CommandResult", "CommandNotHere", "free_port", "accelerate_launch", "LaunchOptions",
    "SEED_CHECKS", "passed", "skipped", "assert_matches", "match", "parse_kv",
    "installed", "editable", "public_version", "same_version",
    "NbtoolsError", "DeviceError", "ParameterError", "LaunchError", "LaunchTimeout", "OutputMismatch",
]
