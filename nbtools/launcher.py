"""The launch rule: how a written ``accelerate launch`` becomes the one that runs on this machine.

``launch_spec`` decides a launch once (a ``LaunchSpec``): the device route (``DeviceInfo.plan``), the
flags and variables, the config file, what of this environment must not reach it, and the ``# why:``
line the cell prints, produced from those same decisions. ``launch`` runs it (guarded.run_command), on
another free port if its port was taken meanwhile, and again after a gloo teardown abort (at most twice).
``accelerate_launch`` does both in one call.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .commands import LaunchCall, executable, shell_line
from .device import VISIBLE_VARS, DeviceInfo, LaunchPlan
from .diagnose import Result, gloo_exit_abort, raise_on_failure
from .errors import LaunchError, ParameterError
from .guarded import Background, Shown, as_shown, free_port, run_command, start_background
from .params import validate

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
_PORT_IN_USE = re.compile(r"address already in use|EADDRINUSE|errno: 98", re.IGNORECASE)


@dataclass(frozen=True)
class LaunchSpec:
    """One ``accelerate launch``, decided once; ``argv``/``shown`` for a port.

    ``shown(port)`` is the command line a learner can paste into a terminal in the launch's folder (the
    bench's bare side runs exactly that); ``argv(port)`` is the same with this environment's ``accelerate``.
    """

    plan: LaunchPlan
    call: LaunchCall
    env: tuple[tuple[str, str | None], ...] = ()  # the plan's variables, the caller's; None: removed
    flags: tuple[str, ...] = ()  # --config_file ..., then the caller's extra flags
    why: str = ""  # why the launch that runs differs from the written one (the cell's `# why:` line)
    notes: tuple[str, ...] = ()  # what the cell says before the command (fallback, ignored variables)
    timeout: float | None = 600
    cwd: str | None = None
    port: int | None = None  # None: a free one per try

    def argv(self, port: int | None, shown: bool = False) -> list[str]:
        ports = ["--main_process_port", str(port)] if port else []
        head = ["accelerate" if shown else executable("accelerate"), "launch", *self.plan.flags]
        return [*head, "--mixed_precision", self.call.mixed_precision, *self.flags, *ports, self.call.script,
                *self.call.script_args]

    def shown(self, port: int | None) -> str:
        return shell_line(self.argv(port, shown=True), dict(self.env))

    def next_port(self) -> int | None:
        return (self.port or free_port()) if self.plan.num_processes > 1 else None


def route_config(call: LaunchCall, plan: LaunchPlan, folder: str) -> list[str]:
    """The learner's own --config_file as written (nothing added), else Accelerate's defaults in a file in ``folder``,
    so that the user's default config is never read. With a config file `accelerate launch` no longer picks
    MULTI_NPU by itself for N processes on N NPUs: on NPU the file says it; elsewhere the plan's flags decide."""
    if call.config_file is not None:
        return []
    return launch_config(plan.distributed_type if plan.kind == "npu" else "NO", folder)


def launch_spec(call: LaunchCall, *, info: DeviceInfo | None = None, device: str = "auto", timeout: float | None = 600,
                port: int | None = None, cwd: str | os.PathLike | None = None, fit: bool = False) -> LaunchSpec:
    """Validate ``call`` (a written or built ``accelerate launch``) and decide how it runs here.

    The device route comes from ``DeviceInfo.plan`` (with its reasons); this function adds the config
    file (the learner's own ``--config_file`` as written, else Accelerate's defaults in a file beside the
    script, so that the user's default config is never read), removes this environment's ACCELERATE_*
    variables, and says why in one line. ``fit``: the learner's own job, which shrinks to the visible cards (plan).
    """
    written = call.plan_flags  # --cpu means device="cpu"; a written port is used; the others are the plan's
    device = "cpu" if "--cpu" in written else device
    if port is None and (text := written.get("--main_process_port")) is not None:
        if not str(text).isdigit() or not 0 < int(text) < 65536:
            raise ParameterError(f"--main_process_port={text!r} is invalid; accepted: a port number 1-65535")
        port = int(text)
    info = validate(device=device, num_processes=call.num_processes, mixed_precision=call.mixed_precision,
                    timeout_s=timeout, info=info)
    plan = info.plan(call.num_processes, device, fit=fit)
    notes = [f"[nbtools] NOTE {plan.note}"] if plan.fallback else []
    run_env = dict(plan.env, **call.env)
    # ACCELERATE_* variables exported in the kernel would change the launch: they are removed.
    if unset := foreign_accelerate_vars(run_env):
        notes.append(f"[nbtools] 不用这个环境里的 {', '.join(sorted(unset))}（启动需要的变量由启动计划给出）")
    folder = str(cwd if cwd is not None else os.getcwd())
    config_flags = route_config(call, plan, folder)
    why = [*plan.why]
    var = VISIBLE_VARS.get(plan.kind)
    if var and call.written_visible is not None and call.written_visible != plan.env.get(var):
        why.append(f"{plan.num_processes} 个进程的计划用卡 {plan.env.get(var)}")
    if plan.num_processes > 1 and call.written is not None:
        why.append(f"照写的会合端口 {port}" if "--main_process_port" in written else "用一个空闲的会合端口代替 29500")
    if "--cpu" in written:
        why.append("照写的 --cpu：在 CPU 上运行")
    if replaced := [k for k in written if k not in ("--num_processes", "--mixed_precision", "--main_process_port", "--cpu")]:
        why.append(f"你写的 {' '.join(replaced)} 由本机的启动计划决定")
    why.append(_config_why(call, plan))
    return LaunchSpec(plan, call, (*run_env.items(), *((k, None) for k in unset)), (*config_flags, *call.extra_flags),
                      "；".join(w for w in why if w), tuple(notes), timeout, folder, port)


def foreign_accelerate_vars(launch_env) -> list[str]:
    """ACCELERATE_* variables of this environment that a launch does not set itself: to be removed."""
    return [k for k in os.environ if k.startswith("ACCELERATE_") and k not in launch_env]


def _config_why(call: LaunchCall, plan: LaunchPlan) -> str:
    """What the config file changes: Accelerate's defaults given explicitly, or the learner's file as written."""
    if call.config_file is None:
        return "显式给出 Accelerate 的默认配置（工作文件夹里的 accelerate_config_*.json），你的 `accelerate config` 文件不会改变这次运行"
    kind = call.config.get("distributed_type", "NO")
    said = (f"照写的用你的 --config_file {call.config_file}（distributed_type {kind}），"
            "其中的 num_processes 和 mixed_precision 显式给出")
    if plan.kind == "cpu" and kind in ("FSDP", "DEEPSPEED"):
        said += f"；Accelerate 只在加速卡上启用 {kind}，所以这份配置在这里跑的是 DDP"
    return said


@dataclass(frozen=True, kw_only=True)
class LaunchOptions:
    """The rest of what ``accelerate_launch`` takes, by name: a misspelt one is a TypeError naming it here."""

    env: dict[str, str] | None = None  # the written launch: variables in front, flags before the script
    extra_flags: tuple[str, ...] = ()
    port: int | None = None  # where it runs (launch_spec)
    cwd: str | os.PathLike | None = None
    info: DeviceInfo | None = None
    check: bool = True  # how it runs (launch)
    offline: bool = True
    background: bool = False
    echo: bool = True  # what is shown
    written: str | None = None
    timeout_name: str = "timeout_s"
    fit: bool = False  # the learner's own job: fewer cards than --num_processes shrinks the count (DeviceInfo.plan)


def accelerate_launch(script: str | os.PathLike, *script_args: str, num_processes: int = 2, mixed_precision: str = "no",
                      device: str = "auto", timeout: float | None = 600,
                      options: LaunchOptions = LaunchOptions()) -> Result | Background:
    """``accelerate launch script ...`` on ``num_processes`` ranks, decided by ``launch_spec`` and run by ``launch``;
    the why line is always the one the launch rule derives."""
    o = options
    call = LaunchCall.of(script, *script_args, num_processes=num_processes, mixed_precision=mixed_precision, env=o.env,
                         extra_flags=o.extra_flags)
    spec = launch_spec(call, info=o.info, device=device, timeout=timeout, port=o.port, cwd=o.cwd, fit=o.fit)
    shown = Shown(echo=o.echo, written=o.written, timeout_name=o.timeout_name)
    return launch(spec, check=o.check, offline=o.offline, echo=shown, background=o.background)


def launch_config(distributed_type: str, folder: str | os.PathLike) -> list[str]:
    """``["--config_file", NAME]``: Accelerate's defaults with ``distributed_type``, written as NAME into
    ``folder`` (the launch's working directory) and kept there, so that the printed command runs as printed."""
    name = f"accelerate_config_{distributed_type.lower()}.json"
    text = json.dumps(dict(NEUTRAL_CONFIG, distributed_type=distributed_type), indent=2) + "\n"
    path = Path(folder) / name
    try:
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
        return ["--config_file", name]
    except OSError:  # a read-only working directory: a private copy (then the printed path is absolute)
        path = Path(tempfile.mkdtemp(prefix="nbtools-accelerate-")) / name
        path.write_text(text, encoding="utf-8")
        return ["--config_file", str(path)]


def launch(spec: LaunchSpec, *, check: bool = True, offline: bool = True, echo: bool | Shown = True,
           background: bool = False) -> Result | Background:
    """Run the launch ``spec`` decided; on a port taken meanwhile retry on another; on a gloo teardown
    abort rerun, at most twice. ``echo``: as for ``run_command`` (its ``why`` defaults to the spec's).

    torch's gloo aborts a rank at exit now and then, after all its work and even after
    ``end_training()`` (measured on a 2-core CPU with torch 2.14.1: about 1 launch in 8 of an
    evaluation script). Each rerun is said in the cell; a third abort fails the launch.
    """
    shown = as_shown(echo)
    if shown.echo and spec.notes:
        print("\n".join(spec.notes))
    tries = 2 + MAX_ABORT_RERUNS  # the first try, one more after a port taken meanwhile, the reruns
    abort_reruns = 0
    for attempt in range(tries):
        port = spec.next_port()
        this = dataclasses.replace(shown, command=spec.shown(port), why=spec.why)  # always the rule's own why line
        if background:
            bg = start_background(spec.argv(port), env=dict(spec.env), cwd=spec.cwd, offline=offline, echo=this)
            bg.plan, bg.port = spec.plan, port
            return bg
        try:
            result = run_command(spec.argv(port), env=dict(spec.env), cwd=spec.cwd, timeout=spec.timeout,
                                 check=False, offline=offline, echo=this)
        except LaunchError as exc:  # a LaunchTimeout: its result with the plan
            if exc.result is not None:
                exc.result = dataclasses.replace(exc.result, plan=spec.plan, port=port)
            raise
        result = dataclasses.replace(result, plan=spec.plan, port=port)
        retry = _retry_reason(result, spec, abort_reruns) if attempt + 1 < tries else None
        if retry is None:
            break
        abort_reruns += retry == "abort"
        if shown.echo:
            print(_retry_line(retry, port, abort_reruns, spec.plan))
    if check:
        raise_on_failure(result)
    return result


def _retry_reason(result: Result, spec: LaunchSpec, abort_reruns: int) -> str | None:
    """"port" (taken meanwhile), "abort" (a gloo teardown abort after the work) or None: keep this result."""
    if result.returncode == 0:
        return None
    if spec.port is None and spec.plan.num_processes > 1 and _PORT_IN_USE.search(result.output):
        return "port"
    return "abort" if abort_reruns < MAX_ABORT_RERUNS and gloo_exit_abort(result.output, spec.plan) else None


def _retry_line(reason: str, port: int | None, abort_reruns: int, plan: LaunchPlan) -> str:
    if reason == "port":
        return f"[nbtools] port {port} was taken meanwhile; retrying on another free port"
    whose = ("torch's gloo on CPU" if plan.kind == "cpu" else
             "the simulated NPU's transport, which is torch's gloo under a simulated hccl: not a property of hccl")
    return (
        "[nbtools] a rank aborted while exiting AFTER its work ('terminate called without an active "
        f"exception': a known teardown race of {whose}); {ABORT_RERUN_SAID} "
        f"({abort_reruns} of at most {MAX_ABORT_RERUNS}) -- the output below is what the checks see"
    )
