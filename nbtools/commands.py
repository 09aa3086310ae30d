"""The rules that turn a command as a learner writes it into the one that runs on this machine.

A notebook cell shows the quick-start's command exactly (``python ...``, ``uv pip install ...``,
``ASCEND_RT_VISIBLE_DEVICES=0,1 accelerate launch ...``). Some of those mean something else here
(another interpreter on PATH, no NPU, no ``uv``), so each rule below rewrites one thing and says
why in one line. Only these rules exist: there is no general rewriter.

- ``parse``: options (``--timeout S``, ``SWITCHES``), ``NAME=VALUE`` prefixes, argv;
  a command may span lines (quotes over newlines, backslash-newline continuations).
- ``command_here``: the real argv/env of a command (``%cmd``).
- ``dispatch_rule``: the quick-start's dispatch program (``python -c``) with its two devices on this machine.
- ``parse_launch``: a written ``accelerate launch`` split into script, flags and variables (``%launch``);
  launcher.launch_spec decides how it runs here and why.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .device import VISIBLE_VARS, DeviceInfo
from .errors import NbtoolsError, ParameterError
from .lang import msg
from .plan import PLAN_FLAGS

ASCEND_VAR = VISIBLE_VARS["npu"]
CUDA_VAR = VISIBLE_VARS["cuda"]
_ENV_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")

# The quick-start's check-torch one-liner (its `-c` program), and what it becomes without torch_npu.
CHECK_TORCH = (
    "import torch, torch_npu; print('torch=', torch.__version__); print('torch_npu=', torch_npu.__version__); "
    "print('is_available:', torch.npu.is_available()); print('count:', torch.npu.device_count())"
)
CHECK_TORCH_WITHOUT_NPU = (
    "import torch; print('torch=', torch.__version__); print('torch_npu=', 'not installed'); "
    "print('is_available:', torch.cuda.is_available()); print('count:', torch.cuda.device_count())"
)

# `accelerate launch` flags that take no value (everything else starting with - takes one).
_LAUNCH_SWITCHES = {
    "--cpu", "--multi_gpu", "--tpu", "--use_xpu", "--ipex", "-m", "--module", "--no_python",
    "--use_deepspeed", "--use_fsdp", "--use_megatron_lm", "--use_parallelism_config", "--debug",
    "-q", "--quiet", "--same_network", "--enable_cpu_affinity", "--downcast_bf16",
    "--tpu_use_cluster", "--tpu_use_sudo", "--vm",
}


class CommandNotHere(NbtoolsError):
    """The written program does not exist on this machine (e.g. ``npu-smi`` off an Ascend host)."""


@dataclass
class WrittenCommand:
    """A command as written in a cell, split up (after IPython's ``{expr}`` expansion)."""

    text: str  # as written, options removed: what the cell prints after `$ `
    env: dict[str, str]
    argv: list[str]
    timeout: float | None = None
    allow_fail: bool = False
    online: bool = False
    background: bool = False  # %launch --background: started, not waited for (launcher.Background)
    verbatim: bool = False  # %cmd --as-written accelerate launch: the line without the launch rule (05's trap)
    fit: bool = False  # %launch --fit: the learner's own job, shrunk to the visible cards (DeviceInfo.plan)


@dataclass
class CommandHere:
    """What really runs here for a written command, and why it differs."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)  # added to the environment (and shown)
    why: list[str] = field(default_factory=list)

    @property
    def why_line(self) -> str:
        return "；".join(self.why)


def _join_continuations(text: str) -> str:
    """Drop backslash-newline (a shell line continuation) outside single quotes, like a shell does."""
    out, quote, i = [], None, 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and quote != "'" and i + 1 < len(text):
            if text[i + 1] != "\n":  # backslash-newline is dropped, any other escape kept
                out.append(text[i : i + 2])
            i += 2
            continue
        if ch in "'\"" and quote in (None, ch):
            quote = None if quote == ch else ch
        elif ch == "\n" and quote is None:
            if "".join(out).strip() and text[i + 1 :].strip():
                raise ParameterError(
                    "one command per %cmd / %%cmd cell: a new line outside quotes starts a second command "
                    "(end the line with \\ to continue it)"
                )
        out.append(ch)
        i += 1
    return "".join(out)


def split(text: str) -> list[str]:
    """shlex (posix) words of a command that may span lines."""
    try:
        return shlex.split(_join_continuations(text), posix=True)
    except ValueError as exc:  # unbalanced quotes
        raise ParameterError(f"cannot parse the command ({exc}): {text.strip()[:200]}") from None


# The options without a value, in WrittenCommand's field order; --background and --fit are %launch's, --as-written %cmd's
SWITCHES = ("--allow-fail", "--online", "--background", "--as-written", "--fit")


def parse(text: str) -> WrittenCommand:
    """Options, env prefix and argv of a written command."""
    words = split(text)
    timeout, switches = None, dict.fromkeys(SWITCHES, False)
    while words and words[0].startswith("--"):
        opt = words.pop(0)
        if opt in switches:
            switches[opt] = True
        elif opt == "--timeout" or opt.startswith("--timeout="):
            value = opt.split("=", 1)[1] if "=" in opt else (words.pop(0) if words else "")
            try:
                timeout = float(value)
                assert timeout > 0
            except (ValueError, AssertionError):
                raise ParameterError(f"--timeout {value!r}: expected a number of seconds > 0") from None
        else:
            raise ParameterError(f"unknown option {opt!r}; accepted before the command: --timeout S, "
                                 f"{', '.join(SWITCHES)}")
    env: dict[str, str] = {}
    while words and _ENV_ASSIGN.match(words[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    if not words:
        raise ParameterError("no command given (e.g. `%cmd python --version`)")
    rest = text.strip()  # the text as written minus the leading nbtools options (kept verbatim otherwise)
    while m := re.match(rf"({'|'.join(SWITCHES)}|--timeout(?:=\S+|\s+\S+))(\s+|$)", rest):
        rest = rest[m.end():]
    return WrittenCommand(rest, env, words, timeout, *switches.values())


def _quote(word: str) -> str:
    """Shell quoting that keeps a ``python -c`` program readable: double quotes where they suffice."""
    plain = shlex.quote(word)
    return plain if plain == word or any(c in word for c in '"\\$`') else f'"{word}"'


def shell_line(argv: list[str], env: dict[str, str | None] | None = None) -> str:
    """A command line as a learner would type it (env prefix included; None values are not shown),
    programs kept readable: the one shell quoting of nbtools."""
    prefix = " ".join(f"{k}={_quote(v)}" for k, v in (env or {}).items() if v is not None)
    return (prefix + " " if prefix else "") + " ".join(_quote(w) for w in argv)


def executable(name: str) -> str:
    """The program ``name`` of the kernel's own environment (beside sys.executable), else PATH."""
    local = Path(sys.executable).with_name(name)
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if not found:
        raise CommandNotHere(msg("commands.not_installed", python=sys.executable, name=name))
    return found


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
        kind = info.resolve(device)
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


@dataclass
class LaunchCall:
    """An ``accelerate launch`` as written (``parse_launch``) or built (``of``), read by one reader
    (``_read_call``); launcher.launch_spec (the normaliser) decides it. None: not written, filled in there."""

    script: str
    script_args: list[str]
    num_processes: int | None  # written (--num_processes, else the --config_file's), None: not written
    mixed_precision: str | None
    extra_flags: list[str]  # written flags other than those the plan decides (plan.PLAN_FLAGS)
    env: dict[str, str]  # written variables other than the visible-devices ones
    written_visible: str | None = None
    command: WrittenCommand | None = None  # the whole command as written: its options (--timeout, --background, ...)
    config_file: str | None = None  # the learner's own --config_file, honoured as `accelerate launch` does
    config: dict = field(default_factory=dict)  # what that file says
    plan_flags: dict = field(default_factory=dict)  # written flags the plan decides (PLAN_FLAGS): launch_spec says how
    flag_words: list[str] = field(default_factory=list)  # every written flag, as written (a machine of 06 keeps them)

    @classmethod
    def of(cls, script: str, *script_args: str, num_processes: int | None = None, mixed_precision: str | None = None,
           env: dict[str, str] | None = None, extra_flags=()) -> LaunchCall:
        """A launch built in code (``nbtools.accelerate_launch``), read as if it were written: ``extra_flags`` by the
        same reader as a written command, so a flag the plan decides is honoured or refused, never repeated."""
        call = _read_call([*map(str, extra_flags), str(script), *map(str, script_args)], dict(env or {}))
        if call.script != str(script):
            raise ParameterError(f"extra_flags={tuple(extra_flags)!r}: `{call.script}` is no flag of accelerate launch")
        for name, given, read in (("--num_processes", num_processes, call.num_processes),
                                  ("--mixed_precision", mixed_precision, call.mixed_precision)):
            if given is not None and name in call.plan_flags and str(given) != str(read):
                raise ParameterError(f"{name} given twice: {given} as a parameter and {read} in extra_flags; keep one")
        call.num_processes = call.num_processes if num_processes is None else num_processes
        call.mixed_precision = mixed_precision or call.mixed_precision
        return call


def parse_launch(text: str) -> LaunchCall:
    """Split ``[OPTIONS] [ENV=..] accelerate launch [flags] script [args]`` (the quick-start's core command)."""
    written = parse(text)
    if written.argv[:2] != ["accelerate", "launch"]:
        raise ParameterError(
            "%launch runs `accelerate launch ...` (e.g. `%launch accelerate launch --num_processes 2 train_npu.py`); "
            f"got `{shlex.join(written.argv[:2])}`: use %cmd for other commands"
        )
    env = dict(written.env)
    visible = [env.pop(var) for var in VISIBLE_VARS.values() if var in env]  # the plan's (DeviceInfo.cards)
    call = _read_call(written.argv[2:], env)
    call.command, call.written_visible = written, (visible or [None])[-1]
    return call


def _read_call(words: list[str], env: dict[str, str]) -> LaunchCall:
    """The one reader of ``accelerate launch``'s words: flags (a flag the plan decides written twice, or --cpu
    with --multi_gpu, which Accelerate refuses, is a ParameterError), then the script and its arguments."""
    flags: dict[str, str | None] = {}
    extra: list[str] = []
    i = 0
    while i < len(words) and words[i].startswith("-"):
        name, eq, value = words[i].partition("=")
        switch = name in _LAUNCH_SWITCHES
        width = 1 if switch or eq else 2  # `--flag value` takes the next word
        if i + width > len(words):
            raise ParameterError(f"accelerate launch flag {name} needs a value")
        if name in flags and (name in PLAN_FLAGS or name == "--config_file"):
            raise ParameterError(f"accelerate launch: {name} written twice; keep one")
        flags[name] = None if switch else value if eq else words[i + 1]
        if name not in PLAN_FLAGS:
            extra.extend(words[i : i + width])
        i += width
    if i >= len(words):
        raise ParameterError("accelerate launch needs a script to run (e.g. train_npu.py)")
    if "--cpu" in flags and "--multi_gpu" in flags:
        raise ParameterError("accelerate launch: --cpu and --multi_gpu together are refused by Accelerate; write --cpu "
                             "(nbtools starts a multi-process CPU group itself) or --multi_gpu")
    config_file = flags.get("--config_file")
    config = read_launch_config(config_file) if config_file else {}
    n = flags.get("--num_processes", config.get("num_processes"))
    n = None if n is None else int(n) if str(n).isdigit() else n  # checked by the normaliser (params.validate)
    precision = flags.get("--mixed_precision") or config.get("mixed_precision")
    return LaunchCall(words[i], words[i + 1 :], n, None if precision is None else str(precision), extra, env,
                      config_file=config_file, config=config,
                      plan_flags={k: v for k, v in flags.items() if k in PLAN_FLAGS}, flag_words=words[:i])


def read_launch_config(path: str) -> dict:
    """A learner's `accelerate config` file (YAML, or the JSON `accelerate config default` writes)."""
    import yaml

    try:
        config = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ParameterError(f"--config_file {path}: cannot read it ({exc.strerror}); write it first "
                             "(`accelerate config --config_file ...` in a terminal, or %%writefile)") from None
    except yaml.YAMLError as exc:
        raise ParameterError(f"--config_file {path} is not valid YAML: {exc}") from None
    if not isinstance(config, dict):
        raise ParameterError(f"--config_file {path}: expected `key: value` lines, got {type(config).__name__}")
    return config
