"""Read what a command printed: its ``CommandResult``, whether it failed, which rank failed first, and why.

A launch fails on a non-zero exit, on an error marker in its output (ERROR_MARKERS: the quick-start's
doc-test engine fails a run on them), or on its timeout. The one benign exception is torch elastic's
exit-barrier traceback after a clean exit (``benign_blocks``). Known symptoms get a hint (HINTS).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .device import CANN_FIX
from .errors import LaunchError
from .expected import KEY, parse_kv

# The quick-start's doc-test engine fails a run whose output holds any of these.
ERROR_MARKERS = ("Traceback (most recent call last)", "[ERROR]", "ERR99999")
# Known symptoms in a failed launch's output, and what to do about them.
HINTS = (
    (
        "terminate called without an active exception",
        "a rank aborted in gloo's teardown (gloo aborts at exit): end the script with "
        "accelerator.end_training(); if it already does, this is a rare torch teardown race: run it again",
    ),
    (
        "EADDRINUSE",
        "another process holds this rendezvous port (two launches at once?): pass a free one with "
        "--main_process_port (nbtools.accelerate_launch picks one itself)",
    ),
    ("libhccl.so", f"CANN's libraries are not loaded: {CANN_FIX}"),
    ("out of memory. Tried to allocate", "the card, or this process's share of it (set_per_process_memory_fraction), "
     "is full: a smaller batch, or shard the model (08_sharding: FSDP2, ZeRO-3)"),
    (
        "Cannot re-initialize NPU in forked subprocess",
        "the NPU was initialised in this kernel before notebook_launcher forked: restart the kernel "
        "and call notebook_launcher before any .to('npu')",
    ),
)

# A warning that one rank writes between another rank's text and its newline (unbuffered, print() writes
# the two separately) lands in the middle of that line: `epoch=3 train_loss=0.0898/.../c10d_logger.py:83:
# FutureWarning: ...`. It is put back on a line of its own. Three kinds: Python's ("<file>.py:<line>:
# <Category>Warning: "), torch's C++ log lines ("[rank1]:[W1201 23:22:48.794764329 logger.cpp:329] ") and DeepSpeed's.
_WARNING_START = re.compile(
    r"(?:/|[A-Za-z]:\\)[^\s:]*\.py:\d+: \w*Warning: "
    r"|(?:\[(?:rank|default)\d+\]:)?\[[WEI]\d{4} \d\d:\d\d:\d\d\.\d+ +\d* *[\w./-]+:\d+\] "
    r"|\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\] \[(?:WARNING|INFO|ERROR)\] \[[\w.]+:\d+:\w+\] "  # DeepSpeed's logger
)


def unglue_warning(line: str) -> str:
    """``line`` with a warning glued into its middle moved onto a line of its own; likewise a rank's ``key=value`` line
    glued to the end of another rank's that begins with the same key (ranks printing the same line at once:
    ``norm_dtype=torch.float32norm_dtype=torch.float32``)."""
    m = _WARNING_START.search(line)
    if m is not None and m.start() > 0 and not line[m.start() - 1].isspace():
        return line[: m.start()] + "\n" + line[m.start():]
    key = re.match(f"{KEY}=", line)
    again = line.find(key.group(), key.end()) if key else -1
    while again > 0 and not line[again - 1].isalnum():  # `a=1 a=2` or `p=x/p=y`: written so, not glued
        again = line.find(key.group(), again + 1)
    return line if again <= 0 else line[:again] + "\n" + unglue_warning(line[again:])


@dataclass
class CommandResult:
    command: str  # as a learner would type it
    argv: list[str]
    returncode: int
    output: str
    duration_s: float
    plan: object = None  # a launch's decide.LaunchSpec (its route: .kind, .backend, ...)
    port: int | None = None
    killed: list[int] = field(default_factory=list)
    as_written: str | None = None  # the command as the learner wrote it (``command``: what ran)
    notes: list[str] = field(default_factory=list)  # benign oddities recognised and explained (benign_blocks)
    clean: str = ""  # the output without what is known to be benign: what the verdict read (benign_blocks, once)
    error: LaunchError | None = field(default=None, repr=False)  # the verdict (judged): None when it passed

    @property
    def kv(self) -> dict[str, str]:
        """``key=value`` lines of the output (see expected.parse_kv)."""
        return parse_kv(self.output)

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def __repr__(self) -> str:  # a cell ending in `%cmd ...` shows this, below the streamed output
        lines = len(self.output.splitlines())
        return f"<CommandResult: exit {self.returncode}, {lines} line(s) of output in {self.duration_s:.1f} s>"


def _tail(text: str, n: int = 25, prefix: str = "") -> str:
    """The last ``n`` lines of ``text`` (those starting with ``prefix``), indented."""
    return "\n".join("    " + ln for ln in [ln for ln in text.rstrip().splitlines() if ln.startswith(prefix)][-n:])


def failing_rank(output: str) -> int | None:
    """The first rank whose own traceback appears, else the rank torch elastic names as root cause."""
    if tb := re.search(r"^\[rank(\d+)\]:\s*Traceback", output, re.MULTILINE):
        return int(tb.group(1))
    root = re.search(r"Root Cause.*?rank\s*:\s*(\d+)", output, re.DOTALL)
    return int(root.group(1)) if root else None


def gloo_exit_abort(output: str, plan) -> bool:
    """A gloo launch (CPU, or the simulated NPU's hccl) whose only failure is a rank aborting in teardown,
    with no Python error. Never a real NPU's or GPU's: hccl and nccl get no rerun."""
    return (
        plan.gloo
        and "terminate called without an active exception" in output
        and re.search(r"^\[rank\d+\]:\s*Traceback", output, re.MULTILINE) is None
    )


# torch's log prefix, e.g. "E1201 04:10:11.123000 1234 torch/distributed/elastic/agent/server/api.py:1008] ",
# possibly behind a "[rank1]:" tag; multi-line records repeat it on every line.
_LOG_PREFIX = re.compile(r"^(?:\[rank\d+\]:)?(?:\[?[IWEF]\d{4} [\d:.]+ +\d+ [^\]]*\] ?)?")
EXIT_BARRIER = "Error waiting on exit barrier"
EXIT_BARRIER_NOTE = (
    "[nbtools] note: torch elastic logged \"Error waiting on exit barrier\" with a traceback above AFTER every rank "
    "of this machine had finished and the launch exited 0: the agent that holds the rendezvous store (machine 0) had "
    "already left. It is benign and is not counted as an error."
)


def benign_blocks(output: str, returncode: int) -> tuple[str, list[str]]:
    """The output without what is known to be benign, and a note for each kind removed.

    Only one thing is benign: torch elastic's exit-barrier error (its log line and the traceback
    under it) in a launch that exited 0, i.e. every rank of this machine finished and exited 0.
    Any other traceback, a non-zero exit, or another marker stays in and still fails the launch.
    """
    if returncode != 0 or EXIT_BARRIER not in output:
        return output, []
    lines = output.splitlines(keepends=True)
    kept: list[str] = []
    i = 0
    while i < len(lines):
        if EXIT_BARRIER not in lines[i]:
            kept.append(lines[i])
            i += 1
            continue
        # torch's logger repeats the record's prefix on every line of it: only lines with THAT prefix are its
        # traceback; a genuine traceback a rank prints right after it has none and stays in
        prefix = _LOG_PREFIX.match(lines[i]).group(0)
        i += 1
        # The traceback(s) that logger.exception appended: frames are indented; the exception line is not;
        # chained exceptions continue after "During handling ..." / "The above exception ...".
        while i < len(lines) and (not prefix or lines[i].startswith(prefix)):
            body = _LOG_PREFIX.sub("", lines[i]).rstrip("\n")
            if body.startswith("Traceback (most recent call last)"):
                i += 1
                while i < len(lines) and _LOG_PREFIX.sub("", lines[i])[:1] in (" ", "\t") and lines[i].startswith(prefix):
                    i += 1
                if i < len(lines) and lines[i].startswith(prefix):
                    i += 1  # the exception line itself
                continue
            if not body.strip() or body.startswith(("During handling of the above", "The above exception was")):
                nxt = next((_LOG_PREFIX.sub("", ln) for ln in lines[i + 1 : i + 3] if ln.strip()), "")
                if nxt.startswith(("Traceback", "During handling", "The above exception")):
                    i += 1
                    continue
            break
    return "".join(kept), [EXIT_BARRIER_NOTE]  # EXIT_BARRIER is in the output: some line held it


def judged(command: str, argv: list[str], returncode: int, output: str, duration_s: float, killed=(),
           as_written: str | None = None) -> CommandResult:
    """The ``CommandResult`` of a command that ended, with its verdict: read once (``benign_blocks``), failed on a
    non-zero exit or an error marker, its ``error`` then a ``LaunchError`` with the rank that failed first and its
    error line (``.rank``, ``.line``); guarded.settle decides whether it raises."""
    text, notes = benign_blocks(output, returncode)
    result = CommandResult(command, list(argv), returncode, output, duration_s, killed=list(killed),
                           as_written=as_written, notes=notes, clean=text)
    found = [m for m in ERROR_MARKERS if m in text]
    if returncode == 0 and not found:
        return result
    head = (f"command failed with exit code {returncode} after {duration_s:.1f} s" if returncode != 0
            else f"command exited 0 but its output holds the error marker {found[0]!r} ({duration_s:.1f} s)")
    rank = failing_rank(output)
    mine = _tail(output, 20, f"[rank{rank}]:") if rank is not None else ""
    error = re.findall(r"^\s*\[rank\d+\]:\s*((?:[\w.]+\.)?\w*(?:Error|Exception): .*)$", mine, re.MULTILINE)
    line = error[-1][:200] if error else None
    head += f" -- rank {rank}: {line}" if error else ""  # the exception, in the reason a report shows
    detail = f"Rank {rank} failed first; its last lines:\n{mine}" if mine else f"Last lines of the output:\n{_tail(output)}"
    if killed:
        detail += f"\n(stopped {len(killed)} leftover process(es) of this launch)"
    detail += "".join(f"\nhint: {hint}" for needle, hint in HINTS if needle in output)
    result.error = LaunchError(f"{head}\n  $ {command}\n{detail}", result, rank, line)
    return result


def timeout_message(result: CommandResult, before: str, timeout: float | None, timeout_name: str) -> str:
    return (
        f"stopped after {timeout_name}={timeout:g} s: the command was still running "
        f"(every process of it has been ended).\n  $ {result.command}\n"
        f"If the machine is only slow, raise `{timeout_name}`; if it hangs (e.g. a rank waiting in a "
        f"collective for a peer that never comes), see its last lines before the stop:\n{_tail(before, 15)}"
    )

