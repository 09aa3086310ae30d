"""The machines of a multi-machine job, run at once on one host (06_multi_node).

A multi-machine ``accelerate launch`` is one command per machine, identical but for
``--machine_rank``. On one host they can all run at the same time and really meet at the
rendezvous; what this module adds is the plumbing a notebook cell should not carry:

- ``simulated(text)``: the real command for one machine's command as written for two Ascend
  hosts. Here every machine is a launch on this host with CPU ranks: the visible-devices
  variable is dropped, ``ACCELERATE_USE_CPU=1`` and ``--multi_gpu`` make the ranks a real gloo
  group (on a CPU, ``accelerate launch`` alone starts one process that runs alone).
- ``run_all(jobs)``: every job in its own thread through ``launcher.run_command`` (timeout, error markers,
  the whole process tree stopped on any way out). The first job that fails makes the others stop
  at once: they would otherwise wait for it at the rendezvous or in a collective until the
  timeout. Ctrl-C (JupyterLab's stop button) stops them all.
- ``run_machines(texts)``: both, printing each machine's command as written, what really runs and
  why, then each machine's output; raises a ``LaunchError`` naming the machine that failed first.

A job's processes are found by a marker variable (``NBTOOLS_MACHINE``) that every process of the
job inherits, and stopped from the top: SIGTERM to the topmost ones (the launcher's guardian, or
``accelerate launch`` itself, whose agent ends its workers), then SIGKILL to whatever is left.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import time
import uuid
from dataclasses import dataclass, field

import psutil

from . import commands
from .checks import LaunchError, LaunchTimeout, ParameterError
from .launcher import Result, announce, benign_blocks, foreign_accelerate_vars, neutral_config, run_command, shell_line
from .proctree import stop_from_top

MACHINE_ENV = "NBTOOLS_MACHINE"  # "<run id>-<job index>" on every process of one job
DROPPED = (commands.ASCEND_VAR, commands.CUDA_VAR)
SIMULATED_WHY = (
    "no second host here: each machine is an `accelerate launch` on this host (127.0.0.1) with CPU ranks; "
    "ACCELERATE_USE_CPU=1 + --multi_gpu make them one real gloo group (hccl between hosts is not exercised)"
)


@dataclass
class Job:
    """One command to run: what really runs, and how it was written."""

    argv: list[str]
    env: dict[str, str]
    written: str = ""
    why: str = ""
    unset: tuple[str, ...] = ()  # variables of this environment the command must not inherit
    hidden: list[str] = field(default_factory=list)  # arguments inserted after argv[1], not shown

    @property
    def shown(self) -> str:
        """The real command as a learner would type it (program name, not its full path)."""
        return shell_line(["accelerate" if self.argv[0].endswith("/accelerate") else self.argv[0], *self.argv[1:]], self.env)

    @property
    def real_argv(self) -> list[str]:
        return [*self.argv[:2], *self.hidden, *self.argv[2:]]


@dataclass
class Outcome:
    """How one job ended: its result (also when it failed), its error, whether it was stopped by us."""

    result: Result | None
    error: LaunchError | None = None
    stopped: bool = False  # stopped because another job failed (or Ctrl-C), not by a fault of its own
    ended: float = 0.0  # time.monotonic() when it ended

    @property
    def output(self) -> str:
        return self.result.output if self.result is not None else ""


def simulated(text: str) -> Job:
    """The command that stands in here for one machine's ``accelerate launch``, as written for real hosts."""
    written = commands.parse(text)
    if written.argv[:2] != ["accelerate", "launch"]:
        raise ParameterError(f"a machine runs `accelerate launch ...`; got `{written.text[:80]}`")
    env = {k: v for k, v in written.env.items() if k not in DROPPED}
    env["ACCELERATE_USE_CPU"] = "1"
    flags = written.argv[2:]
    if "--multi_gpu" not in flags:
        flags = ["--multi_gpu", *flags]
    argv = [commands.executable("accelerate"), "launch", *flags]
    # The user's own Accelerate setup must not change the machines' launches (as for every launch).
    unset = foreign_accelerate_vars(env)
    return Job(argv, env, written.text, SIMULATED_WHY, unset)


def processes_of(token: str) -> list[psutil.Process]:
    """Live descendants of this process that carry the job marker ``token``."""
    found = []
    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return []
    for proc in children:
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get(MACHINE_ENV) == token:
                found.append(proc)
        except psutil.Error:
            pass
    return found


def stop(token: str) -> bool:
    """Stop every process of one job (its topmost first: the guardian stops its own tree). False if none was found."""
    procs = processes_of(token)
    if not procs:
        return False
    pids = {p.pid for p in procs}
    tops = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            if proc.ppid() not in pids:
                tops.append(proc)
    stop_from_top(procs, tops)
    stop_from_top(processes_of(token), [])  # anything the job started while it was being stopped
    return True


def run_all(jobs: list[Job], *, timeout: float | None, timeout_name: str = "timeout_s", poll: float = 0.5) -> list[Outcome]:
    """Run the jobs at once; the first failure stops the others. One Outcome per job, in order."""
    run_id = uuid.uuid4().hex[:12]
    tokens = [f"{run_id}-{i}" for i in range(len(jobs))]
    outcomes: dict[int, Outcome] = {}
    stopped: set[int] = set()

    def work(i: int) -> None:
        job = jobs[i]
        try:
            result = run_command(job.real_argv, env={**job.env, MACHINE_ENV: tokens[i]}, unset=job.unset, shown=job.shown,
                         timeout=timeout, timeout_name=timeout_name, echo=False)
            outcomes[i] = Outcome(result, ended=time.monotonic())
        except LaunchError as exc:  # non-zero exit, error marker or timeout: its own tree is already stopped
            outcomes[i] = Outcome(exc.result, exc, ended=time.monotonic())

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(jobs))) as pool:
        futures = {pool.submit(work, i): i for i in range(len(jobs))}
        pending = set(futures)
        try:
            while pending:
                done, pending = concurrent.futures.wait(
                    pending, timeout=poll, return_when=concurrent.futures.FIRST_COMPLETED
                )
                for fut in done:
                    fut.result()  # an unexpected exception in a worker thread surfaces here
                if any(o.error is not None for o in outcomes.values()):
                    for fut in pending:  # the others would wait for the failed job until the timeout
                        i = futures[fut]
                        if i not in stopped and stop(tokens[i]):
                            stopped.add(i)
        except BaseException:  # Ctrl-C (the stop button) or anything else: no job keeps running
            for i, token in enumerate(tokens):
                if stop(token):
                    stopped.add(i)
            raise
    out = []
    for i in range(len(jobs)):
        o = outcomes.get(i, Outcome(None, LaunchError("did not run")))
        o.stopped = i in stopped
        out.append(o)
    return out


def first_failure(outcomes: list[Outcome]) -> int | None:
    """The job that failed first by a fault of its own (else the first stopped one), or None if all passed."""
    failed = [i for i, o in enumerate(outcomes) if o.error is not None]
    if not failed:
        return None
    own = [i for i in failed if not outcomes[i].stopped] or failed
    return min(own, key=lambda i: outcomes[i].ended)


def failure_error(outcomes: list[Outcome], timeout: float | None, name: str = "machine") -> LaunchError | None:
    """The LaunchError a cell raises for these outcomes (None when every job passed)."""
    first = first_failure(outcomes)
    if first is None:
        return None
    error = outcomes[first].error
    if isinstance(error, LaunchTimeout):
        head = (f"the {name}s were still running after timeout_s={timeout} and were stopped: a {name} that hangs, "
                f"or never reaches the rendezvous, keeps the others waiting")
    else:
        head = (f"{name} {first} failed first; the other {name}(s) were stopped if still running "
                f"(they would have waited for it until timeout_s)")
    lines = [f"{name} {i}: {'stopped' if o.stopped else str(o.error).splitlines()[0]}"
             for i, o in enumerate(outcomes) if o.error is not None]
    return LaunchError(head + "\n" + "\n".join(lines) + f"\n{name} {first} in full:\n{error}", outcomes[first].result)


def print_outcomes(outcomes: list[Outcome], name: str = "machine") -> None:
    """Each job's output under a header; torch elastic's benign exit-barrier traceback replaced by one line."""
    for rank, o in enumerate(outcomes):
        state = "stopped" if o.stopped else ("FAILED" if o.error else "ok")
        print(f"===== {name} {rank} ({state}) =====")
        text, notes = benign_blocks(o.output, o.result.returncode if o.result is not None else 1)
        print("\n".join([text.rstrip(), *notes]).strip())


def run_machines(texts: list[str], *, timeout: float | None, timeout_name: str = "timeout_s") -> list[Result]:
    """Run one simulated machine per written command, all at once; print each output; raise on a failure."""
    jobs = [simulated(text) for text in texts]
    for rank, job in enumerate(jobs):
        print(f"# machine {rank}:")
        print(announce(job.shown, job.written, job.why if rank == 0 else "").rstrip())
    with neutral_config() as config_flags:  # a default config from `accelerate config` is not read
        for job in jobs:
            if "--config_file" not in job.argv:
                job.hidden = config_flags
        start = time.monotonic()
        outcomes = run_all(jobs, timeout=timeout, timeout_name=timeout_name)
    print_outcomes(outcomes)
    error = failure_error(outcomes, timeout)
    if error is not None:
        raise error
    print(f"[machines] {len(jobs)} machines finished in {time.monotonic() - start:.1f} s")
    return [o.result for o in outcomes]
