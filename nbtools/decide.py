"""The launch rule, in one place: how a written ``accelerate launch`` becomes the one that runs on this machine.

Everything that DECIDES a launch lives here, and nothing here runs one or writes a file:

- the reader of the written words: ``parse`` (a command's options, ``NAME=VALUE`` prefixes and argv, for ``%cmd``
  too), ``parse_launch`` / ``LaunchCall.of`` (``accelerate launch``'s flags, script and variables, one reader:
  ``_read_call``); a flag the route decides written twice, or ``--cpu`` with ``--multi_gpu``, is refused there;
- the parameter rules every entry point asks (``known_device``, ``whole_numbers``, ``precisions_on``,
  ``check_precision``, ``validate``; the defaults ``DEFAULT_PROCESSES``, ``DEFAULT_TIMEOUT_S``);
- the route rule: ``plan(info, n, device)``: which kind, cards, variables and flags a REAL n-process group takes
  here, and why it differs from the quick-start's NPU command (``cards``, ``cpu_stands_in``, ``cpu_route``,
  ``hide_cards``);
- the spec: ``launch_spec(call)``, the normaliser every launch goes through (a ``%launch`` cell, a launch built in
  code, a machine of 06, ``python -m nbtools launch``, the bench), as one frozen ``LaunchSpec``: route, flags,
  variables, the files the launch needs (its config file, the hidden-cards shim) as data, the printed command and the
  ``# why:`` line (``why_line``), which names each value filled in or replaced.

No other module builds an ``accelerate launch`` argv (tests/test_normaliser.py). ``guarded.launch`` runs specs.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sys
import tempfile
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path

from .device import BACKENDS, DISTRIBUTED_TYPES, SIMULATED, VISIBLE_VARS, DeviceInfo, cache_root, detect, listed_ids
from .errors import CommandNotHere, DeviceError, ParameterError
from .lang import msg

KINDS = ("npu", "cuda", "cpu")
MIXED_PRECISIONS = ("no", "fp16", "bf16")  # the one list: the CLI's choices, the normaliser, each kind's share
DEFAULT_PROCESSES = 2  # the one process-count default: setup, a launch that names none, the CLI, the route
DEFAULT_TIMEOUT_S = 600  # seconds a session's launches and commands may run (setup, the magics, a launch in code)
# The open session (session.Session: nbtools.setup sets it, its close() clears it): what a launch fills from where
# nothing is written (device, count, timeout, probe). Held here, in the core, so that deciding needs no other module.
OPEN = None

# ---------------------------------------------------------------- the parameter rules


def known_device(device: str) -> str:
    """The one rule for a ``device`` value (validate, resolve): 'auto' or a kind."""
    if device not in ("auto", *KINDS):
        accepted = ", ".join(map(repr, ("auto", *KINDS)))
        raise ParameterError(f"parameter device={device!r} is not known; accepted: {accepted}")
    return device


def whole_numbers(minimum: int = 1, **params) -> None:
    """Every keyword is an integer (not a bool) >= ``minimum``: the one rule for counts, num_processes among them
    (validate, plan, a written --num_processes, the notebooks' own parameters through params.py)."""
    for name, value in params.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ParameterError(f"parameter {name}={value!r} is invalid; accepted: an integer >= {minimum}")


def precisions_on(kind: str, bf16: bool) -> tuple[str, ...]:
    """The one rule for the --mixed_precision values a launch on ``kind`` takes (DeviceInfo, a check's needs:bf16): the
    CPU's autocast has bf16 and no fp16; a card has fp16, and bf16 where it says so (``bf16``; not a 310P)."""
    if kind == "cpu":
        return tuple(p for p in MIXED_PRECISIONS if p != "fp16")  # a CPU's autocast has no fp16
    return MIXED_PRECISIONS if bf16 else tuple(p for p in MIXED_PRECISIONS if p != "bf16")


def check_precision(info: DeviceInfo, precision: str, kind: str) -> str:
    """The one precision rule (validate, the normaliser): known, and taken by a launch on ``kind`` here."""
    ok = precisions_on(kind, info.bf16)
    if precision not in ok:
        raise ParameterError(f"parameter mixed_precision={precision!r} is " + (
            f"not supported on {kind} ({', '.join(info.names[:1]) or kind}); accepted here: {', '.join(ok)}"
            if precision in MIXED_PRECISIONS else f"not known; accepted: {', '.join(MIXED_PRECISIONS)}"))
    return precision


def resolve(info: DeviceInfo, device: str = "auto") -> str:
    """Turn a ``device`` parameter into a device kind present here, or raise with what to do."""
    if known_device(device) == "auto":
        return info.kind
    if device == "cpu" or device == info.kind:
        return device
    hints = "; ".join(f"{p.what} -> {p.fix}" for p in info.problems) or \
        "run `python -m nbtools doctor` to see what this machine has"
    raise DeviceError(f"device={device!r} asked, but this machine's accelerator is {info.kind!r} "
                      f"({info.count} device(s)). Use device='auto' or '{info.kind}'. {hints}")


def validate(*, device: str = "auto", num_processes: int | None = None, mixed_precision: str | None = None,
             timeout_s: float | None = None, info: DeviceInfo | None = None, require_healthy: bool = True) -> DeviceInfo:
    """Raise ParameterError naming the parameter and the accepted values; return the device info.

    A broken setup (e.g. torch_npu without CANN) raises DeviceError with the fix, unless
    ``require_healthy`` is False (a notebook that explains the fix must still run).
    """
    known_device(device)
    if num_processes is not None:
        whole_numbers(1, num_processes=num_processes)
    if timeout_s is not None and (not isinstance(timeout_s, (int, float)) or timeout_s <= 0):
        raise ParameterError(f"parameter timeout_s={timeout_s!r} is invalid; accepted: a number of seconds > 0")
    info = info or detect()
    if require_healthy and (blocking := [p for p in info.problems if p.blocking]):
        raise DeviceError("the setup is broken: " + "; ".join(f"{p.what}\n  fix: {p.fix}" for p in blocking)
                          + "\n(`python -m nbtools doctor` checks the whole setup)")
    resolve(info, device)  # DeviceError (names device=..., what is here and what to use)
    if mixed_precision is not None:  # on the kind the route of num_processes runs on (the normaliser asks the same)
        check_precision(info, mixed_precision, plan(info, num_processes, device).kind)
    return info


# ---------------------------------------------------------------- the reader of the written words

_ENV_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
# The options without a value, in WrittenCommand's field order; --background and --fit are %launch's, --as-written %cmd's
SWITCHES = ("--allow-fail", "--online", "--background", "--as-written", "--fit")
# `accelerate launch` flags that take no value (everything else starting with - takes one).
_LAUNCH_SWITCHES = {"--cpu", "--multi_gpu", "--tpu", "--use_xpu", "--ipex", "-m", "--module", "--no_python", "--use_deepspeed",
                    "--use_fsdp", "--use_megatron_lm", "--use_parallelism_config", "--debug", "-q", "--quiet",
                    "--same_network", "--enable_cpu_affinity", "--downcast_bf16", "--tpu_use_cluster", "--tpu_use_sudo", "--vm"}
# `accelerate launch` flags the route decides, with the precision and port: written ones are replaced.
PLAN_FLAGS = frozenset({"--num_processes", "--num_machines", "--dynamo_backend", "--multi_gpu", "--cpu",
                        "--mixed_precision", "--main_process_port"})


@dataclass
class WrittenCommand:
    """A command as written in a cell, split up (after IPython's ``{expr}`` expansion)."""

    text: str  # as written, options removed: what the cell prints after `$ `
    env: dict[str, str]
    argv: list[str]
    timeout: float | None = None
    allow_fail: bool = False
    online: bool = False
    background: bool = False  # %launch --background: started, not waited for (guarded.Background)
    verbatim: bool = False  # %cmd --as-written accelerate launch: the line without the launch rule (05's trap)
    fit: bool = False  # %launch --fit: the learner's own job, shrunk to the visible cards (plan)


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
        elif ch == "\n" and quote is None and "".join(out).strip() and text[i + 1 :].strip():
            raise ParameterError("one command per %cmd / %%cmd cell: a new line outside quotes starts a second command "
                                 "(end the line with \\ to continue it)")
        out.append(ch)
        i += 1
    return "".join(out)


def parse(text: str) -> WrittenCommand:
    """Options, env prefix and argv of a written command (shlex words; it may span lines)."""
    try:
        words = shlex.split(_join_continuations(text) if "\\" in text or "\n" in text else text, posix=True)
    except ValueError as exc:  # unbalanced quotes
        raise ParameterError(f"cannot parse the command ({exc}): {text.strip()[:200]}") from None
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
            raise ParameterError(f"unknown option {opt!r}; accepted before the command: --timeout S, {', '.join(SWITCHES)}")
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


@dataclass
class LaunchCall:
    """An ``accelerate launch`` as written (``parse_launch``) or built (``of``), read by one reader
    (``_read_call``); ``launch_spec`` decides it. None: not written, filled in there."""

    script: str
    script_args: list[str]
    num_processes: int | None  # written (--num_processes, else the --config_file's), None: not written
    mixed_precision: str | None
    extra_flags: list[str]  # written flags other than those the route decides (PLAN_FLAGS)
    env: dict[str, str]  # written variables other than the visible-devices ones
    written_visible: str | None = None
    command: WrittenCommand | None = None  # the whole command as written: its options (--timeout, --background, ...)
    config_file: str | None = None  # the learner's own --config_file, honoured as `accelerate launch` does
    config: dict = field(default_factory=dict)  # what that file says
    plan_flags: dict = field(default_factory=dict)  # written flags the route decides (PLAN_FLAGS): launch_spec says how
    flag_words: list[str] = field(default_factory=list)  # every written flag, as written (a machine of 06 keeps them)

    @classmethod
    def of(cls, script: str, *script_args: str, num_processes: int | None = None, mixed_precision: str | None = None,
           env: dict[str, str] | None = None, extra_flags=()) -> LaunchCall:
        """A launch built in code (``nbtools.accelerate_launch``), read as if it were written: ``extra_flags`` by the
        same reader as a written command, so a flag the route decides is honoured or refused, never repeated."""
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
            f"got `{shlex.join(written.argv[:2])}`: use %cmd for other commands")
    env = dict(written.env)
    visible = [env.pop(var) for var in VISIBLE_VARS.values() if var in env]  # the route's (cards)
    call = _read_call(written.argv[2:], env)
    call.command, call.written_visible = written, (visible or [None])[-1]
    return call


def _read_call(words: list[str], env: dict[str, str]) -> LaunchCall:
    """The one reader of ``accelerate launch``'s words: flags (a flag the route decides written twice, or --cpu
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
    n = None if n is None else int(n) if str(n).isdigit() else n  # checked by the normaliser (validate)
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


def shell_line(argv: list[str], env: dict[str, str | None] | None = None) -> str:
    """A command line as a learner would type it (env prefix included; None values are not shown), programs kept
    readable: the one shell quoting of nbtools (shlex's, with double quotes where they suffice, as for a ``python -c``
    program)."""
    words = [*((f"{k}=", v) for k, v in (env or {}).items() if v is not None), *(("", w) for w in argv)]
    return " ".join(name + (q if (q := shlex.quote(w)) == w or any(c in w for c in '"\\$`') else f'"{w}"')
                    for name, w in words)


@cache
def executable(name: str) -> str:
    """The program ``name`` of the kernel's own environment (beside sys.executable), else PATH; found once (a
    program not found is looked for again at the next call)."""
    local = Path(sys.executable).with_name(name)
    if local.exists():
        return str(local)
    if found := shutil.which(name):
        return found
    raise CommandNotHere(msg("commands.not_installed", python=sys.executable, name=name))


# ---------------------------------------------------------------- the route rule


def cpu_stands_in(kind: str, cards: int, ranks: int) -> bool:
    """The one rule for fewer cards than ranks (plan, Session.expect, a check's needs): ``ranks`` asked on
    ``kind`` with fewer ``cards`` visible run on the CPU (gloo), labelled as its stand-in."""
    return kind != "cpu" and cards < ranks


def cards(info: DeviceInfo, n: int) -> list[str]:
    """The one rule for the cards ``n`` ranks use: the first ``n`` this process may use (["4", "5"] where
    ASCEND_RT_VISIBLE_DEVICES=4,5,6,7 is set); asked for more, the numbers after its last card follow
    (ascending, no card twice; the route falls back to the CPU there). Session.cards and the route ask here."""
    ids = (listed_ids(info.visible_devices) or [str(i) for i in range(info.count)])[:n]  # as listed, else 0..
    after = max((int(i) for i in ids if i.isdigit()), default=-1) + 1  # "5,4" on CUDA: 6 next, never 5 again
    return ids + [str(i) for i in range(after, after + n - len(ids))]


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
                        '(nbtools.decide.hide_cards)\n',
    "torch_npu/__init__.py": 'raise ImportError("torch_npu is hidden from the CPU stand-in\'s ranks '
                             '(nbtools.decide.hide_cards)")\n',
}


def writable(folder: str | os.PathLike, prefix: str) -> Path:
    """``folder`` where this user may write there (or make it), else a private folder ``prefix<uid>`` in the temporary
    directory: where the launch (guarded.write_files) puts a file the spec names."""
    probe = Path(folder)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return Path(folder) if os.access(probe, os.W_OK) else Path(tempfile.gettempdir()) / f"{prefix}{os.getuid()}"


def hide_cards(host: str) -> tuple[dict[str, str], str, tuple[tuple[str, str], ...]]:
    """(variables, what they do, files) that hide a ``host`` kind's cards from ranks run on its CPU. The cause:
    accelerate 1.15's ``wait_for_everyone`` passes ``device_ids`` on MULTI_CPU too, and torch then builds that barrier
    on the host's accelerator ("No backend type associated with device type npu"; on CUDA "invalid device ordinal")."""
    if host == "cuda":
        return {VISIBLE_VARS["cuda"]: ""}, msg("plan.hide_gpu"), ()
    if host != "npu":
        return {}, "", ()
    folder = writable(cache_root() / "hide-npu", "nbtools-hide-npu-")
    return ({"PYTHONPATH": in_front(folder, os.environ.get("PYTHONPATH")), "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
            msg("plan.hide_npu"), tuple((str(folder / name), text) for name, text in HIDDEN.items()))


def in_front(entry: Path, current: str | None) -> str:
    """A PATH-like value with ``entry`` first and ``current`` (if any) after it."""
    return os.pathsep.join([str(entry), *([current] if current else [])])


def plan(info: DeviceInfo, num_processes: int | None = None, device: str = "auto", fit: bool = False) -> LaunchSpec:
    """The route: how to start ``num_processes`` ranks on ``device`` ('auto' = best available) on ``info``'s host, as
    a ``LaunchSpec`` with no script (``launch_spec`` adds the written launch to it).

    When fewer accelerators are visible than processes asked for, the route is the CPU (gloo) one and says so:
    ``fallback`` is True and ``note`` explains. ``fit`` (the learner's own job, ``%launch --fit``): the count shrinks
    to the visible cards instead, and the ranks run on them.
    """
    n = asked = DEFAULT_PROCESSES if num_processes is None else num_processes
    whole_numbers(1, num_processes=n)
    kind, why, used, files = resolve(info, device), [], (), ()
    if fit and cpu_stands_in(kind, info.count, n):
        n = info.count
        why.append(msg("plan.fit", asked=asked, n=n, name=kind.upper(), on=", ".join(f"{kind}:{i}" for i in range(n))))
    if fallback := cpu_stands_in(kind, info.count, n):
        note = msg("plan.fallback_note", n=n, count=info.count, name=kind.upper(), var=info.visible_var,
                   value=info.visible_devices or msg("plan.unset"))
        env, mode, said = cpu_route(n)
        why.append(msg("plan.fallback_why", n=n, count=info.count, name=kind.upper(), said=said))
        kind = "cpu"
    elif kind == "cpu":
        env, mode, said = cpu_route(n)
        note = msg("plan.cpu_note", n=n) if info.kind == "cpu" else msg("plan.cpu_asked_note", count=info.count, name=info.kind.upper())
        where = msg("plan.no_npu") if info.kind == "cpu" else msg("session.cpu_asked", kind=info.kind.upper())
        why.append(msg("plan.cpu_why", where=where, said=said) if n == 1 else msg("plan.cpu_why_n", where=where, n=n, said=said))
    else:
        used = tuple(cards(info, n))
        env = {VISIBLE_VARS[kind]: ",".join(used)}
        # On NPU, `accelerate launch --num_processes N` with N visible NPUs switches multi-NPU on by
        # itself (accelerate's launch.py): the quick-start's command needs no --multi_gpu there.
        mode = ["--multi_gpu"] if n > 1 and kind == "cuda" else []
        if kind == "cuda":
            why.append(msg("plan.cuda_multi" if mode else "plan.cuda", cuda=VISIBLE_VARS["cuda"], npu=VISIBLE_VARS["npu"]))
        head = SIMULATED if kind == "npu" and info.simulated else kind.upper()
        note = msg("plan.cards_note", head=head, n=n, on=", ".join(info.names[:n]) or kind)
        if kind == "npu" and info.simulated:
            why.append(msg("plan.simulated"))
    if kind == "cpu" and n > 1 and (hidden := hide_cards(info.kind))[0]:  # the stand-in's ranks never see a card
        env, files = {**hidden[0], **env}, hidden[2]
        why.append(msg("plan.hidden", hidden=hidden[1]))
    return LaunchSpec(kind, n, BACKENDS[kind] if n > 1 else None, DISTRIBUTED_TYPES[kind] if n > 1 else "NO", env,
                      (*mode, "--num_processes", str(n), "--num_machines", "1", "--dynamo_backend", "no"), fallback,
                      note, kind == "cpu" or (kind == "npu" and info.simulated), msg("sep").join(why), used, files=files)


# ---------------------------------------------------------------- the spec

# Given to every launch as --config_file, so that the user's own default config is never read.
# Every value is Accelerate's own default; the launch's flags decide the rest.
NEUTRAL_CONFIG = {"compute_environment": "LOCAL_MACHINE", "distributed_type": "NO", "mixed_precision": "no",
                  "use_cpu": False, "debug": False, "num_machines": 1, "gpu_ids": "all"}
NORMALISED_ENV = "NBTOOLS_NORMALISED"  # on every launch the normaliser decided (LaunchSpec.run_env; a test counts them)
FROM_SESSION = object()  # launch_spec's timeout when not given: the open session's timeout_s, else the default
# What torch_npu sets in os.environ only in an interactive interpreter (2.9.0.post2 __init__.py, 2.14.0
# _init/core/optional_features.py: sys.ps1, __IPYTHON__ or ipykernel): a kernel that imported torch has it, its ranks must not.
INTERACTIVE_ENV = {"TASK_QUEUE_ENABLE": "0"}


@dataclass(frozen=True)
class LaunchSpec:
    """One launch, decided once: the route (``plan``) and, from ``launch_spec``, the written launch on it.

    ``shown(port)`` is the command line a learner can paste into a terminal in the launch's folder (the
    bench's bare side runs exactly that); ``argv(port)`` is the same with this environment's ``accelerate``;
    ``run_env()`` the variables it runs with (``env`` and the normaliser's marker, which is not shown); ``files``
    the (path, text) the launch writes before it starts (its config file, the hidden-cards shim).
    """

    kind: str  # the device kind every rank uses: npu / cuda / cpu
    num_processes: int
    backend: str | None  # the torch.distributed backend accelerate will report; None for one process (no group)
    distributed_type: str  # expected accelerate DistributedType name
    env: dict[str, str | None]  # variables in front of `accelerate launch` (None: removed)
    flags: tuple[str, ...]  # the route's flags (port and precision added by launch_spec)
    fallback: bool = False  # True when the CPU (gloo) route stands in for missing accelerators
    note: str = ""
    gloo: bool = False  # the collectives really run on torch's gloo: the CPU route, or the simulated NPU's hccl
    why: str = ""  # why the launch differs from the quick-start's / the written one (the cell's `# why:` line)
    cards: tuple[str, ...] = ()  # the card numbers the ranks use (none on the CPU)
    call: LaunchCall | None = None  # the written launch; None: a route only
    head: tuple[str, ...] = ()  # every flag before the port and the script, in order
    notes: tuple[str, ...] = ()  # what the cell says before the command (fallback, ignored variables)
    timeout: float | None = DEFAULT_TIMEOUT_S
    timeout_name: str = "timeout_s"  # what a timeout message tells the learner to raise
    cwd: str | None = None
    port: int | None = None  # written; None: a free one per try (a machine of 06: its flags as written)
    files: tuple[tuple[str, str], ...] = ()  # (path, text) written by the launch before it starts
    machine: bool = False  # one machine of 06: no port of ours, its flags as written

    def argv(self, port: int | None, shown: bool = False) -> list[str]:
        ports = ["--main_process_port", str(port)] if port else []
        program = "accelerate" if shown else executable("accelerate")
        return [program, "launch", *self.head, *ports, self.call.script, *self.call.script_args]

    def shown(self, port: int | None) -> str:
        return shell_line(self.argv(port, shown=True), self.env)

    def run_env(self) -> dict[str, str | None]:
        return {**self.env, NORMALISED_ENV: "1"}


def launch_spec(call: LaunchCall, *, info: DeviceInfo | None = None, device: str | None = None,
                timeout: float | None | object = FROM_SESSION, cwd: str | os.PathLike | None = None, fit: bool = False,
                machine: bool = False) -> LaunchSpec:
    """The normaliser: every launch is decided here, once. It validates ``call``, fills what is not written from the
    open session (device, count, timeout, probe) or the one default, takes the route (``plan``), names the config file
    (the learner's own ``--config_file`` as written, else Accelerate's defaults in a file beside the script, so that
    the user's default config is never read), removes this environment's ACCELERATE_* variables, and says in one line
    (``why_line``) each value it filled in or replaced. ``fit``: the learner's own job, which shrinks to the visible
    cards. ``machine``: one machine of a multi-machine job written for real hosts (06): its flags kept as written,
    the ranks on this host's CPU."""
    s = OPEN
    written = call.plan_flags  # --cpu means device="cpu"; a written port is used; the rest the route's
    device = "cpu" if "--cpu" in written or machine else device if device is not None else s.device_param if s else "auto"
    timeout = (s.timeout_s if s else DEFAULT_TIMEOUT_S) if timeout is FROM_SESSION else timeout
    if (port := written.get("--main_process_port")) is not None and not (str(port).isdigit() and 0 < int(port) < 65536):
        raise ParameterError(f"--main_process_port={port!r} is invalid; accepted: a port number 1-65535")
    n = call.num_processes if call.num_processes is not None else s.num_processes if s else DEFAULT_PROCESSES
    info = validate(device=device, num_processes=n, timeout_s=timeout, info=info or (s.info if s else None))
    route = plan(info, max(n, 2) if machine else n, device, fit=fit)  # a machine: every machine's ranks together
    precision = check_precision(info, call.mixed_precision or "no", route.kind)
    run_env = dict(route.env, **call.env)
    started = {k: v for k, v in interactive_settings().items() if k not in run_env}  # a written value is kept
    unset = [k for k in os.environ if k.startswith("ACCELERATE_") and k not in run_env]  # they would change it
    folder = str(cwd if cwd is not None else os.getcwd())
    # The config file: the learner's own as written, else Accelerate's defaults in a file in the launch's folder (the
    # printed command runs as printed; in a private folder, named absolutely, where it is read-only). With a config file
    # `accelerate launch` no longer picks MULTI_NPU by itself for N processes on N NPUs: on NPU the file says it.
    kind, used = route.distributed_type if route.kind == "npu" else "NO", writable(folder, "nbtools-accelerate-")
    name, text = f"accelerate_config_{kind.lower()}.json", json.dumps(dict(NEUTRAL_CONFIG, distributed_type=kind), indent=2)
    config = [] if call.config_file else ["--config_file", name if used == Path(folder) else str(used / name)]
    files = () if call.config_file else ((str((used / name).absolute()), text + "\n"),)
    notes = ((f"[nbtools] NOTE {route.note}",) if route.fallback else ()) + (
        ("[nbtools] " + msg("launcher.unset", names=", ".join(sorted(unset))),) if unset else ())
    mode = [f for f in cpu_route(route.num_processes)[1] if f not in call.flag_words] if machine else []
    head = (*mode, *config, *call.flag_words) if machine else (*route.flags, "--mixed_precision", precision, *config,
                                                                 *call.extra_flags)
    spec = replace(route, call=call, env={**run_env, **dict.fromkeys(unset), **started}, head=head, notes=notes,
                   timeout=timeout, cwd=folder, port=None if port is None or machine else int(port), machine=machine,
                   files=route.files + files, timeout_name="--timeout" if call.command and call.command.timeout else
                   "timeout_s" if s or not call.command else "the default timeout")  # where its timeout came from
    return replace(spec, why=why_line(spec, route.why, started, precision, n, bool(s)))


def why_line(spec: LaunchSpec, route: str, started: dict, precision: str, asked: int, from_session: bool) -> str:
    """The cell's ``# why:`` line, from the decided spec alone: the route's reasons, then each value of the written
    launch filled in or replaced (count, cards, precision, port, --cpu, flags, config file, interactive settings).
    ``asked``: the count before the route shrank it (--fit); the cards are the spec's own, never read back from env."""
    call, written = spec.call, spec.call.plan_flags
    gave = msg("sep").join(msg("launcher.interactive", key=k, value=INTERACTIVE_ENV[k]) + (
        f" {k}={v}" if v is not None else msg("launcher.interactive_unset")) for k, v in started.items())
    if spec.machine:
        return msg("sep").join(filter(None, (msg("launcher.machine"), cpu_route(spec.num_processes)[2], gave)))
    why, cards_said = [route], ",".join(spec.cards)
    if call.num_processes is None:
        why.append(msg("launcher.no_num_processes", n=asked,
                       source=msg("launcher.from_session" if from_session else "launcher.default"),
                       on=msg("launcher.cards", cards=cards_said) if cards_said else msg("launcher.on_cpu")))
    elif cards_said and call.written_visible is not None and call.written_visible != cards_said:
        why.append(msg("launcher.plan_cards", n=spec.num_processes, cards=cards_said))
    if call.mixed_precision is None:
        why.append(msg("launcher.no_precision", precision=precision))
    if spec.num_processes > 1 and call.command is not None:
        why.append(msg("launcher.written_port", port=written["--main_process_port"]) if "--main_process_port" in written
                   else msg("launcher.free_port"))
    if "--cpu" in written:
        why.append(msg("launcher.written_cpu"))
    if replaced := [k for k in written if k not in ("--num_processes", "--mixed_precision", "--main_process_port", "--cpu")]:
        why.append(msg("launcher.replaced", flags=" ".join(replaced)))
    kind = call.config.get("distributed_type", "NO")  # the learner's config file: it changes the launch, and DDP on CPU
    why.append(msg("launcher.default_config") if call.config_file is None else msg("launcher.your_config", file=call.config_file,
               kind=kind) + (msg("launcher.ddp_on_cpu", kind=kind) if spec.kind == "cpu" and kind in ("FSDP", "DEEPSPEED") else ""))
    return msg("sep").join(w for w in [*why, gave] if w)


def interactive_settings() -> dict[str, str | None]:
    """Each of INTERACTIVE_ENV's settings this process has now but did not start with: the value it started with (None:
    unset), read from /proc/self/environ (for a kernel: the environment JupyterLab was started with). Empty elsewhere."""
    if not any(os.environ.get(k) == v for k, v in INTERACTIVE_ENV.items()):
        return {}
    try:
        start = dict(e.split("=", 1) for e in map(os.fsdecode, Path("/proc/self/environ").read_bytes().split(b"\0")) if "=" in e)
    except OSError:
        return {}
    return {k: start.get(k) for k, v in INTERACTIVE_ENV.items() if os.environ.get(k) == v != start.get(k)}
