"""The machines of a multi-machine job, run at once on one host (06_multi_node; README, "What runs where").

- ``stand_in(text)``: the command that stands in here for one machine's ``accelerate launch`` as written for
  two Ascend hosts, decided by the normaliser (decide.launch_spec, ``machine=True``): CPU ranks, its flags as
  written, precision checked, this environment's ACCELERATE_* removed.
- ``run_all(jobs)``: every job through ``guarded.run_command`` in its own thread; the first failure stops the
  others (they would wait for it at the rendezvous), and so does Ctrl-C.
- ``run_machines(texts)``: both, through guarded.launch (the launcher's rerun loop: a gloo teardown abort reruns every
  machine), printing each machine's command as written, what runs and why, its output.

A job's processes carry a marker variable (``NBTOOLS_MACHINE``, found by proctree.marked) and are stopped
through their guardian.
"""

from __future__ import annotations

import concurrent.futures
import os
import time
import uuid
from dataclasses import dataclass

from .decide import LaunchSpec, launch_spec, parse_launch, shell_line
from .diagnose import CommandResult
from .errors import LaunchError, LaunchTimeout
from .guarded import Shown, launch, run_command
from .proctree import marked, stop_from_top, tops

MACHINE_ENV = "NBTOOLS_MACHINE"  # "<run id>-<job index>" on every process of one job


@dataclass
class Job:
    """One command to run: what really runs, and how it was written."""

    argv: list[str]
    env: dict[str, str]
    as_written: str = ""
    why: str = ""
    spec: LaunchSpec | None = None  # a machine's launch, as the normaliser decided it

    @property
    def shown(self) -> str:
        """The real command as a learner would type it (program name, not its full path)."""
        return self.spec.shown(None) if self.spec else shell_line(self.argv, self.env)


@dataclass
class Outcome:
    """How one job ended: its result (also when it failed), its error, whether it was stopped by us."""

    result: CommandResult | None
    error: LaunchError | None = None
    stopped: bool = False  # stopped because another job failed (or Ctrl-C), not by a fault of its own
    ended: float = 0.0  # time.monotonic() when it ended

    @property
    def output(self) -> str:
        return self.result.output if self.result is not None else ""


def stand_in(text: str, folder: str | os.PathLike = ".") -> Job:
    """The command that stands in here for one machine's ``accelerate launch``, as written for real hosts, decided by
    the normaliser (decide.launch_spec, ``machine=True``); the config file it names goes into ``folder`` (written by
    guarded.launch)."""
    spec = launch_spec(parse_launch(text), cwd=folder, timeout=None, machine=True)
    return Job(spec.argv(None), spec.run_env(), spec.call.command.text, spec.why, spec)


def stop(token: str) -> bool:
    """Stop every process of one job through its guardian (it stops its own tree). False if none was found."""
    procs = marked(MACHINE_ENV, token, within=os.getpid())  # this job's processes, by its marker
    if not procs:
        return False
    stop_from_top(procs, tops(procs))
    stop_from_top(marked(MACHINE_ENV, token, within=os.getpid()), [])  # anything the job started while it was being stopped
    return True


def run_all(jobs: list[Job], *, timeout: float | None, timeout_name: str = "timeout_s", poll: float = 0.5) -> list[Outcome]:
    """Run the jobs at once; the first failure stops the others. One Outcome per job, in order."""
    run_id = uuid.uuid4().hex[:12]
    tokens = [f"{run_id}-{i}" for i in range(len(jobs))]
    outcomes: dict[int, Outcome] = {}
    stopped: set[int] = set()

    def halt(indices) -> None:
        """Stop these jobs; those that were found running count as stopped by us."""
        stopped.update([i for i in indices if stop(tokens[i])])

    def work(i: int) -> None:
        job = jobs[i]  # a failure (non-zero exit, error marker, timeout) is its result's error: its tree already stopped
        result = run_command(job.argv, env={**job.env, MACHINE_ENV: tokens[i]}, timeout=timeout, check=False,
                             echo=Shown(echo=False, command=job.shown, timeout_name=timeout_name))
        outcomes[i] = Outcome(result, result.error, ended=time.monotonic())

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
                    halt({futures[fut] for fut in pending} - stopped)  # they would wait for it until the timeout
        except BaseException:  # Ctrl-C (the stop button) or anything else: no job keeps running
            halt(range(len(jobs)))
            raise
    for i in range(len(jobs)):
        outcomes.setdefault(i, Outcome(None, LaunchError("did not run"))).stopped = i in stopped
    return [outcomes[i] for i in range(len(jobs))]


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
        text, notes = (o.result.clean, o.result.notes) if o.result is not None else ("", [])  # read once (judged)
        print("\n".join([text.rstrip(), *notes]).strip())


def run_machines(texts: list[str], *, timeout: float | None, timeout_name: str = "timeout_s") -> list[CommandResult]:
    """Run one simulated machine per written command, all at once; print each output; raise on a failure."""
    jobs = [stand_in(text) for text in texts]
    for rank, job in enumerate(jobs):
        print(f"# machine {rank}:")
        print(Shown(as_written=job.as_written, why=job.why if rank == 0 else "").announce(job.shown).rstrip())
    start = time.monotonic()
    runs: list[list[Outcome]] = []

    def together() -> CommandResult | None:
        """Every machine at once; the result of the one that failed first decides a rerun (None: all passed)."""
        runs.append(run_all(jobs, timeout=timeout, timeout_name=timeout_name))
        first = first_failure(runs[-1])
        return None if first is None else runs[-1][first].result

    launch([job.spec for job in jobs], check=False, together=together)  # the launcher's rerun loop, for every machine
    outcomes = runs[-1]
    print_outcomes(outcomes)
    error = failure_error(outcomes, timeout)
    if error is not None:
        raise error
    print(f"[machines] {len(jobs)} machines finished in {time.monotonic() - start:.1f} s")
    return [o.result for o in outcomes]
