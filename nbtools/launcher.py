"""The launch rule: how a written ``accelerate launch`` becomes the one that runs on this machine.

``launch_spec`` is the normaliser: every launch (a ``%launch`` cell, ``accelerate_launch``/``LaunchCall.of`` in
code, a machine of 06, ``python -m nbtools launch``, the bench) is decided there once, as a ``LaunchSpec``: what
is not written filled from the session, the probe or the one default (device.py), the device route
(``DeviceInfo.plan``), the flags and variables, the config file, what of this environment must not reach it, and
the ``# why:`` line the cell prints, which names each value filled in or replaced. No other module builds an
``accelerate launch`` argv (tests/test_normaliser.py). ``launch`` runs a spec (guarded.run_command), on another
free port if its port was taken meanwhile, and again after a gloo teardown abort (at most twice).
``accelerate_launch`` does both in one call.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from . import device as device_rules
from . import session
from .commands import LaunchCall, executable, shell_line
from .device import VISIBLE_VARS, DeviceInfo
from .diagnose import CommandResult, gloo_exit_abort
from .errors import LaunchError, LaunchTimeout, ParameterError
from .guarded import Background, Shown, as_shown, free_port, run_command, start_background
from .lang import msg
from .params import DEFAULT_TIMEOUT_S, validate
from .plan import LaunchPlan, write_files

MAX_ABORT_RERUNS = 2  # reruns of a CPU launch whose only failure is gloo aborting a rank at exit
ABORT_RERUN_SAID = "running the whole launch again"  # in the line a rerun prints (the bench counts them)
# Given to every launch as --config_file, so that the user's own default config is never read.
# Every value is Accelerate's own default; the launch's flags decide the rest.
NEUTRAL_CONFIG = {
    "compute_environment": "LOCAL_MACHINE",
    "distributed_type": "NO",
    "mixed_precision": "no",
    "use_cpu": False,
    "debug": False,
    "num_machines": 1,
    "gpu_ids": "all",
}
NORMALISED_ENV = "NBTOOLS_NORMALISED"  # on every launch the normaliser decided (LaunchSpec.run_env; a test counts them)
FROM_SESSION = object()  # launch_spec's timeout when not given: the open session's timeout_s, else the default
# What torch_npu sets in os.environ only in an interactive interpreter (2.9.0.post2 __init__.py, 2.14.0
# _init/core/optional_features.py: sys.ps1, __IPYTHON__ or ipykernel): a kernel that imported torch has it, its ranks must not.
INTERACTIVE_ENV = {"TASK_QUEUE_ENABLE": "0"}
_PORT_IN_USE = re.compile(r"address already in use|EADDRINUSE|errno: 98", re.IGNORECASE)


@dataclass(frozen=True)
class LaunchSpec:
    """One ``accelerate launch``, decided once by ``launch_spec``; ``argv``/``shown`` for a port.

    ``shown(port)`` is the command line a learner can paste into a terminal in the launch's folder (the
    bench's bare side runs exactly that); ``argv(port)`` is the same with this environment's ``accelerate``;
    ``run_env()`` the variables it runs with (``env`` and the normaliser's marker, which is not shown).
    """

    plan: LaunchPlan
    call: LaunchCall
    env: tuple[tuple[str, str | None], ...] = ()  # the plan's variables, the caller's; None: removed
    head: tuple[str, ...] = ()  # every flag before the port and the script, in order
    why: str = ""  # why the launch that runs differs from the written one (the cell's `# why:` line)
    notes: tuple[str, ...] = ()  # what the cell says before the command (fallback, ignored variables)
    timeout: float | None = DEFAULT_TIMEOUT_S
    cwd: str | None = None
    port: int | None = None  # None: a free one per try

    def argv(self, port: int | None, shown: bool = False) -> list[str]:
        ports = ["--main_process_port", str(port)] if port else []
        program = "accelerate" if shown else executable("accelerate")
        return [program, "launch", *self.head, *ports, self.call.script, *self.call.script_args]

    def shown(self, port: int | None) -> str:
        return shell_line(self.argv(port, shown=True), dict(self.env))

    def run_env(self) -> dict[str, str | None]:
        return {**dict(self.env), NORMALISED_ENV: "1"}

    def next_port(self) -> int | None:
        return (self.port or free_port()) if self.plan.num_processes > 1 else None


def launch_spec(call: LaunchCall, *, info: DeviceInfo | None = None, device: str | None = None,
                timeout: float | None | object = FROM_SESSION, cwd: str | os.PathLike | None = None, fit: bool = False,
                machine: bool = False) -> LaunchSpec:
    """The normaliser: every launch (a %launch cell, one built in code, a machine of 06, the CLI, the bench) is
    decided here, once. It validates ``call``, fills what is not written from the open session (device, count,
    timeout, probe) or the one default, builds the plan (``DeviceInfo.plan``), adds the config file (the learner's
    own ``--config_file`` as written, else Accelerate's defaults in a file beside the script, so that the user's
    default config is never read), removes this environment's ACCELERATE_* variables, and says in one line each
    value it filled in or replaced. ``fit``: the learner's own job, which shrinks to the visible cards (plan).
    ``machine``: one machine of a multi-machine job written for real hosts (06): its flags kept as written, the
    ranks on this host's CPU."""
    s = session.current()
    plan_flags = call.plan_flags  # written: --cpu means device="cpu"; a written port is used; the rest the plan's
    device = "cpu" if "--cpu" in plan_flags or machine else device if device is not None else s.device_param if s else "auto"
    timeout = (s.timeout_s if s else DEFAULT_TIMEOUT_S) if timeout is FROM_SESSION else timeout
    if (port := plan_flags.get("--main_process_port")) is not None and not (str(port).isdigit() and 0 < int(port) < 65536):
        raise ParameterError(f"--main_process_port={port!r} is invalid; accepted: a port number 1-65535")
    port = None if port is None else int(port)
    n = call.num_processes if call.num_processes is not None else s.num_processes if s else device_rules.DEFAULT_PROCESSES
    info = validate(device=device, num_processes=n, timeout_s=timeout, info=info or (s.info if s else None))
    plan = info.plan(max(n, 2) if machine else n, device, fit=fit)  # a machine: every machine's ranks together
    precision = info.check_precision(call.mixed_precision or "no", plan.kind)
    notes = [f"[nbtools] NOTE {plan.note}"] if plan.fallback else []
    run_env = dict(plan.env, **call.env)
    started = {k: v for k, v in interactive_settings().items() if k not in run_env}  # a written value is kept
    gave = msg("sep").join(msg("launcher.interactive", key=k, value=INTERACTIVE_ENV[k]) + (f" {k}={v}" if v is not None else
                                                                                          msg("launcher.interactive_unset")) for k, v in started.items())
    # ACCELERATE_* variables exported in the kernel that the launch does not set would change it: they are removed.
    if unset := [k for k in os.environ if k.startswith("ACCELERATE_") and k not in run_env]:
        notes.append("[nbtools] " + msg("launcher.unset", names=", ".join(sorted(unset))))
    folder = str(cwd if cwd is not None else os.getcwd())
    # The learner's own --config_file as written, else Accelerate's defaults in a file in the folder, so that the
    # user's default config is never read. With a config file `accelerate launch` no longer picks MULTI_NPU by itself
    # for N processes on N NPUs: on NPU the file says it; elsewhere the plan's flags decide.
    config_flags = [] if call.config_file else launch_config(plan.distributed_type if plan.kind == "npu" else "NO", folder)
    env = (*run_env.items(), *((k, None) for k in unset), *started.items())
    if machine:
        mode = [f for f in plan.mode if f not in call.flag_words]
        return LaunchSpec(plan, call, env, (*mode, *config_flags, *call.flag_words), msg("sep").join(filter(None, (msg("launcher.machine"), plan.route, gave))),
                          tuple(notes), timeout, folder, None)
    why = [*plan.why]
    cards = plan.env.get(VISIBLE_VARS.get(plan.kind, ""))
    if call.num_processes is None:
        why.append(msg("launcher.no_num_processes", n=n, source=msg("launcher.from_session" if s else "launcher.default"),
                       on=msg("launcher.cards", cards=cards) if cards else msg("launcher.on_cpu")))
    elif cards and call.written_visible is not None and call.written_visible != cards:
        why.append(msg("launcher.plan_cards", n=plan.num_processes, cards=cards))
    if call.mixed_precision is None:
        why.append(msg("launcher.no_precision", precision=precision))
    if plan.num_processes > 1 and call.command is not None:
        why.append(msg("launcher.written_port", port=port) if "--main_process_port" in plan_flags else msg("launcher.free_port"))
    if "--cpu" in plan_flags:
        why.append(msg("launcher.written_cpu"))
    if replaced := [k for k in plan_flags if k not in ("--num_processes", "--mixed_precision", "--main_process_port", "--cpu")]:
        why.append(msg("launcher.replaced", flags=" ".join(replaced)))
    why += [_config_why(call, plan), gave]
    head = (*plan.flags, "--mixed_precision", precision, *config_flags, *call.extra_flags)
    return LaunchSpec(plan, call, env, head, msg("sep").join(w for w in why if w), tuple(notes), timeout, folder, port)


def interactive_settings() -> dict[str, str | None]:
    """Each of INTERACTIVE_ENV's settings this process has now but did not start with: the value it started with (None:
    unset), read from /proc/self/environ (for a kernel: the environment JupyterLab was started with). Empty elsewhere."""
    try:
        start = dict(e.split("=", 1) for e in map(os.fsdecode, Path("/proc/self/environ").read_bytes().split(b"\0")) if "=" in e)
    except OSError:
        return {}
    return {k: start.get(k) for k, v in INTERACTIVE_ENV.items() if os.environ.get(k) == v != start.get(k)}


def _config_why(call: LaunchCall, plan: LaunchPlan) -> str:
    """What the config file changes: Accelerate's defaults given explicitly, or the learner's file as written."""
    if call.config_file is None:
        return msg("launcher.default_config")
    kind = call.config.get("distributed_type", "NO")
    said = msg("launcher.your_config", file=call.config_file, kind=kind)
    return said + (msg("launcher.ddp_on_cpu", kind=kind) if plan.kind == "cpu" and kind in ("FSDP", "DEEPSPEED") else "")


@dataclass(frozen=True, kw_only=True)
class LaunchOptions:
    """The rest of what ``accelerate_launch`` takes, by name: a misspelt one is a TypeError naming it here."""

    env: dict[str, str] | None = None  # the written launch: variables in front, flags before the script
    extra_flags: tuple[str, ...] = ()
    cwd: str | os.PathLike | None = None
    info: DeviceInfo | None = None
    check: bool = True  # how it runs (launch)
    offline: bool = True
    background: bool = False
    echo: bool = True  # what is shown
    as_written: str | None = None
    timeout_name: str = "timeout_s"
    fit: bool = False  # the learner's own job: fewer cards than --num_processes shrinks the count (DeviceInfo.plan)


def accelerate_launch(script: str | os.PathLike, *script_args: str, num_processes: int | None = None,
                      mixed_precision: str | None = None, device: str | None = None,
                      timeout: float | None | object = FROM_SESSION,
                      options: LaunchOptions = LaunchOptions()) -> CommandResult | Background:
    """``accelerate launch script ...`` on ``num_processes`` ranks, decided by ``launch_spec`` and run by ``launch``;
    the why line is always the one the launch rule derives. None: from the open session, else the defaults."""
    o = options
    call = LaunchCall.of(script, *script_args, num_processes=num_processes, mixed_precision=mixed_precision, env=o.env,
                         extra_flags=o.extra_flags)  # a port: ("--main_process_port", N) among them
    spec = launch_spec(call, info=o.info, device=device, timeout=timeout, cwd=o.cwd, fit=o.fit)
    shown = Shown(echo=o.echo, as_written=o.as_written, timeout_name=o.timeout_name)
    return launch(spec, check=o.check, offline=o.offline, echo=shown, background=o.background)


def launch_config(distributed_type: str, folder: str | os.PathLike) -> list[str]:
    """``["--config_file", NAME]``: Accelerate's defaults with ``distributed_type``, written as NAME into
    ``folder`` (the launch's working directory) and kept there, so that the printed command runs as printed."""
    name = f"accelerate_config_{distributed_type.lower()}.json"
    text = json.dumps(dict(NEUTRAL_CONFIG, distributed_type=distributed_type), indent=2) + "\n"
    used = write_files(Path(folder), {name: text}, "nbtools-accelerate-")
    # a read-only working directory: a private copy, and the printed path is absolute
    return ["--config_file", name if used == Path(folder) else str(used / name)]


def launch(spec: LaunchSpec, *, check: bool = True, offline: bool = True, echo: bool | Shown = True,
           background: bool = False) -> CommandResult | Background:
    """Run the launch ``spec`` decided; on a port taken meanwhile retry on another; on a gloo teardown
    abort rerun, at most twice. ``echo``: as for ``run_command`` (its ``why`` defaults to the spec's).

    torch's gloo aborts a rank at exit now and then, after all its work and even after
    ``end_training()`` (measured on a 2-core CPU with torch 2.14.1: about 1 launch in 8 of an
    evaluation script). Each rerun is said in the cell; a third abort fails the launch.
    """
    shown = as_shown(echo)
    if shown.echo and spec.notes:
        print("\n".join(spec.notes))
    tries, abort_reruns = 2 + MAX_ABORT_RERUNS, 0  # the first try, one more after a port taken meanwhile, the reruns
    for attempt in range(tries):
        port = spec.next_port()
        this = dataclasses.replace(shown, command=spec.shown(port), why=spec.why)  # always the rule's own why line
        if background:
            bg = start_background(spec.argv(port), env=spec.run_env(), cwd=spec.cwd, offline=offline, echo=this)
            bg.plan, bg.port = spec.plan, port
            return bg
        try:  # whether a failure raises is run_command's to decide (check); here only whether it is tried again
            result, error = run_command(spec.argv(port), env=spec.run_env(), cwd=spec.cwd, timeout=spec.timeout,
                                        check=check, offline=offline, echo=this), None
        except LaunchError as exc:
            result, error = exc.result, exc
        if result is not None:  # the CommandResult run_command built, with this launch's plan and port
            result.plan, result.port = spec.plan, port
        last = attempt + 1 == tries or isinstance(error, LaunchTimeout)  # a timeout is never run again
        if (retry := None if last else _retry_reason(result, spec, abort_reruns)) is None:
            break
        abort_reruns += retry == "abort"
        if shown.echo:
            print(retry_line(retry, port, abort_reruns, spec.plan))
    if error is not None:
        raise error
    return result


def _retry_reason(result: CommandResult, spec: LaunchSpec, abort_reruns: int) -> str | None:
    """"port" (taken meanwhile), "abort" (a gloo teardown abort after the work) or None: keep this result."""
    if result.returncode != 0 and spec.port is None and spec.plan.num_processes > 1 and _PORT_IN_USE.search(result.output):
        return "port"
    return "abort" if result.returncode != 0 and abort_rerun(result, spec.plan, abort_reruns) else None


def abort_rerun(result: CommandResult | None, plan: LaunchPlan, abort_reruns: int) -> bool:
    """Is this failure a gloo teardown abort after the work, to be run again (at most MAX_ABORT_RERUNS)? The
    launcher and the machines of 06 both ask here."""
    return result is not None and abort_reruns < MAX_ABORT_RERUNS and gloo_exit_abort(result.output, plan)


def retry_line(reason: str, port: int | None, abort_reruns: int, plan: LaunchPlan) -> str:
    if reason == "port":
        return f"[nbtools] port {port} was taken meanwhile; retrying on another free port"
    whose = ("torch's gloo on CPU" if plan.kind == "cpu" else
             "the simulated NPU's transport, which is torch's gloo under a simulated hccl: not a property of hccl")
    return ("[nbtools] a rank aborted while exiting AFTER its work ('terminate called without an active "
            f"exception': a known teardown race of {whose}); {ABORT_RERUN_SAID} "
            f"({abort_reruns} of at most {MAX_ABORT_RERUNS}) -- the output below is what the checks see")
