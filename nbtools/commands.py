"""The rules that turn a command as a learner writes it into the one that runs on this machine.

A notebook cell shows the quick-start's command exactly (``python ...``, ``uv pip install ...``,
``ASCEND_RT_VISIBLE_DEVICES=0,1 accelerate launch ...``). Some of those mean something else here
(another interpreter on PATH, no NPU, no ``uv``), so each rule below rewrites one thing and says
why in one line. Only these rules exist: there is no general rewriter.

The written words are read by decide.py's ``parse`` (options, ``NAME=VALUE`` prefixes, argv; a command may span
lines), which also reads ``accelerate launch`` (``parse_launch``) and decides how a launch runs here and why: this
module is ``%cmd``'s only.

- ``command_here``: the real argv/env of a command (``%cmd``).
- ``dispatch_rule``: the quick-start's dispatch program (``python -c``) with its two devices on this machine.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from dataclasses import dataclass, field

from .decide import WrittenCommand, executable, parse, resolve, shell_line  # noqa: F401 (parse, shell_line: %cmd's)
from .device import VISIBLE_VARS, DeviceInfo
from .errors import CommandNotHere, NbtoolsError, ParameterError  # noqa: F401 (CommandNotHere: nbtools.*)
from .lang import msg

ASCEND_VAR = VISIBLE_VARS["npu"]
CUDA_VAR = VISIBLE_VARS["cuda"]

# The quick-start's check-torch one-liner (its `-c` program), and what it becomes without torch_npu.
CHECK_TORCH = (
    "import torch, torch_npu; print('torch=', torch.__version__); print('torch_npu=', torch_npu.__version__); "
    "print('is_available:', torch.npu.is_available()); print('count:', torch.npu.device_count())"
)
CHECK_TORCH_WITHOUT_NPU = (
    "import torch; print('torch=', torch.__version__); print('torch_npu=', 'not installed'); "
    "print('is_available:', torch.cuda.is_available()); print('count:', torch.cuda.device_count())"
)

@dataclass
class CommandHere:
    """What really runs here for a written command, and why it differs."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)  # added to the environment (and shown)
    why: list[str] = field(default_factory=list)

    @property
    def why_line(self) -> str:
        return "；".join(self.why)


def torch_npu_installed() -> bool:
    return importlib.util.find_spec("torch_npu") is not None


# The quick-start's devices in its dispatch program, and the half each one holds.
QUICKSTART_FIRST, QUICKSTART_SECOND = "npu:0", "npu:1"
OFFLOAD_FOLDER = "offload"  # relative to the work folder, where the program runs


def split_targets(kind: str, count: int) -> tuple[str, str, str]:
    """(first half, second half, why) of the quick-start's split for ``count`` devices of ``kind``."""
    if kind in ("npu", "cuda") and count >= 2:
        why = "" if kind == "npu" else msg("commands.cuda_dispatch")
        return f"{kind}:0", f"{kind}:1", why
    if kind in ("npu", "cuda") and count == 1:
        return f"{kind}:0", "cpu", msg("commands.one_card_dispatch", name=kind.upper(), kind=kind)
    return "cpu", "disk", msg("commands.cpu_dispatch", folder=OFFLOAD_FOLDER)


def adapt_dispatch(program: str, kind: str, count: int) -> tuple[str, str]:
    """The quick-start's dispatch program for this machine: (program, why); why is "" when unchanged."""
    first, second, why = split_targets(kind, count)
    if not why:
        return program, ""
    quoted = re.findall(r"""(['"])(npu:[01])\1""", program)
    if {d for _, d in quoted} != {QUICKSTART_FIRST, QUICKSTART_SECOND}:
        raise NbtoolsError("the program does not name both 'npu:0' and 'npu:1' as quoted device strings")
    real = re.sub(r"""(['"])npu:0\1""", lambda m: f"{m[1]}{first}{m[1]}", program)
    real = re.sub(r"""(['"])npu:1\1""", lambda m: f"{m[1]}{second}{m[1]}", real)
    if second == "disk":
        real, n = re.subn(r"device_map=device_map,", f"device_map=device_map, offload_folder='{OFFLOAD_FOLDER}',", real)
        if n != 1:
            raise NbtoolsError("cannot add offload_folder: expected one `device_map=device_map,` argument")
    return real, why


def dispatch_rule(argv: list[str], kind: str, count: int) -> tuple[list[str], str] | None:
    """For ``%cmd``: ``python -c <the quick-start's dispatch program>`` on this machine -> (argv, why).

    None when ``argv`` is not that program (a load_checkpoint_and_dispatch over 'npu:0' and 'npu:1') or when it runs
    unchanged here (two NPUs).
    """
    if len(argv) != 3 or argv[1] != "-c" or "load_checkpoint_and_dispatch(" not in argv[2]:
        return None
    if {d for _, d in re.findall(r"""(['"])(npu:[01])\1""", argv[2])} != {QUICKSTART_FIRST, QUICKSTART_SECOND}:
        return None
    program, why = adapt_dispatch(argv[2], kind, count)
    return ([argv[0], "-c", program], why) if why else None


def command_here(written: WrittenCommand, info: DeviceInfo, device: str = "auto") -> CommandHere:
    """The command that really runs here for ``written`` (``%cmd``), with the reasons.

    ``device`` is the notebook's device parameter: the quick-start's dispatch program is adapted to it.
    """
    argv, env = list(written.argv), dict(written.env)
    real = CommandHere(argv, env)
    prog = argv[0]
    if prog in ("python", "python3"):
        argv[0] = sys.executable
        real.why.append(msg("commands.python"))
        if argv[1:] == ["-c", CHECK_TORCH] and not torch_npu_installed():
            argv[2] = CHECK_TORCH_WITHOUT_NPU
            real.why.append(msg("commands.no_torch_npu"))
        kind = resolve(info, device)
        if kind == "cpu" and info.kind != "cpu":
            env["ACCELERATE_USE_CPU"] = "1"
            real.why.append(msg("commands.cpu_asked", kind=info.kind.upper()))
        if adapted := dispatch_rule(argv, kind, info.count if kind != "cpu" else 0):
            argv[:] = adapted[0]
            real.why.append(adapted[1])
    elif prog == "uv" and argv[1:2] == ["pip"] and shutil.which("uv"):  # uv itself, aimed at the kernel's interpreter
        argv[:] = [shutil.which("uv"), "pip", *argv[2:3], "--python", sys.executable, *argv[3:]]
        real.why.append(msg("commands.uv_pip"))
    elif prog == "pip" or (prog == "uv" and argv[1:2] == ["pip"]):
        argv[:] = [sys.executable, "-m", "pip", "--disable-pip-version-check", *argv[2 if prog == "uv" else 1:]]
        real.why.append(msg("commands.no_uv" if prog == "uv" else "commands.pip"))
    elif prog == "accelerate":
        if argv[1:2] == ["launch"] and not written.verbatim:
            raise ParameterError("%cmd has no launch rule (on a CPU `accelerate launch --num_processes 2` starts ONE "
                                 "process): write `%launch accelerate launch ...`, or `%cmd --as-written accelerate "
                                 "launch ...`")
        argv[0] = executable("accelerate")
        real.why.append(msg("commands.accelerate"))
    elif prog == "npu-smi" and shutil.which("npu-smi") is None:
        raise CommandNotHere(msg("commands.no_npu_smi", kind=info.kind.upper()))
    if ASCEND_VAR in env and info.kind != "npu":  # the quick-start's NPU variable means the same for CUDA
        value = env.pop(ASCEND_VAR)
        if info.kind == "cuda":
            env[CUDA_VAR] = value
            real.why.append(msg("commands.cuda_visible", cuda=CUDA_VAR, ascend=ASCEND_VAR))
        else:
            real.why.append(msg("commands.cpu_visible", ascend=ASCEND_VAR))
    return real
