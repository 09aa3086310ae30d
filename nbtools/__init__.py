"""nbtools: the plumbing behind the Accelerate-on-Ascend notebook series.

The learner-facing API: ``nbtools.setup`` (session.py) and the ``%cmd`` / ``%%cmd`` /
``%launch`` magics (magics.py, rules in commands.py) after ``%load_ext nbtools``.
Underneath: device detection (device.py), the launcher (launcher.py), expected-output
matching (expected.py), versions (versions.py), check verdicts (checks.py), parameters and work dirs
(params.py), the guardian every command runs under (guard.py), the notebook runner (runner.py, model.py,
report.py, html_report.py), the hygiene check (hygiene.py) and the doctor (doctor.py). Importing this package never imports torch.
"""

from .checks import SEED_CHECKS, passed, skipped
from .commands import CommandNotHere
from .device import DeviceInfo, LaunchPlan, detect
from .errors import DeviceError, LaunchError, LaunchTimeout, NbtoolsError, OutputMismatch, ParameterError
from .expected import assert_matches, match, parse_kv
from .launcher import Result, accelerate_launch, free_port, run_command
from .params import cleanup, validate, work_dir
from .session import Session, setup
from .versions import editable, installed, public_version, same_version

__version__ = "0.1.0"


def load_ipython_extension(ip):
    """``%load_ext nbtools``: register the magics that run a learner's commands (magics.py)."""
    from .magics import register

    register(ip)

__all__ = [
    "SEED_CHECKS",
    "CommandNotHere",
    "DeviceError",
    "DeviceInfo",
    "LaunchError",
    "LaunchPlan",
    "LaunchTimeout",
    "NbtoolsError",
    "OutputMismatch",
    "ParameterError",
    "Session",
    "Result",
    "accelerate_launch",
    "assert_matches",
    "cleanup",
    "detect",
    "editable",
    "free_port",
    "installed",
    "match",
    "parse_kv",
    "passed",
    "public_version",
    "run_command",
    "same_version",
    "setup",
    "skipped",
    "validate",
    "work_dir",
]
