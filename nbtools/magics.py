"""IPython magics that run a command exactly as a learner writes it: ``%cmd``, ``%%cmd NAME``, ``%launch``.

``%load_ext nbtools`` registers them. Each prints ``$ <command as written>``, then, where this machine
needs another command for the same meaning, ``# runs here as: <real>`` and ``# why: <one line>``
(rules in commands.py and decide.py), streams the output (guarded.run_command underneath: timeout,
whole process tree stopped, error markers) and returns an ``nbtools.CommandResult``.

Options before the command: ``--timeout S``, ``--allow-fail`` (return the CommandResult instead of raising),
``--online`` (let Hugging Face reach the network), and for ``%launch`` ``--background`` (return a
``guarded.Background`` at once; its tree is stopped by ``stop()``, ``S.close()`` or the kernel's end) and ``--fit``
(the learner's own job: fewer visible cards than ``--num_processes`` shrinks the count, the ranks run on the cards,
and the why line says so; ``decide.plan``). Without ``nbtools.setup`` the magics use device
"auto", the kernel's cwd and a 600 s timeout.
"""

from __future__ import annotations

import os
import re
import shlex
import sys

from IPython.core.magic import Magics, line_cell_magic, magics_class

from . import commands, session
from .decide import DEFAULT_TIMEOUT_S, FROM_SESSION, launch_spec, parse_launch
from .device import detect
from .diagnose import CommandResult
from .errors import LaunchTimeout, ParameterError
from .guarded import Shown, launch, run_command

_FIELD = re.compile(r"(?<!\{)\{([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\}(?!\})")
_NAME = re.compile(r"^[A-Za-z_]\w*$")


def expand_fields(text: str, namespace: dict) -> str:
    """Replace ``{name}`` / ``{name.attr}`` whose name exists in ``namespace``; leave every other brace
    (f-strings and dicts of a ``python -c`` program) exactly as written."""

    def sub(m: re.Match) -> str:
        root, *attrs = m.group(1).split(".")
        if root not in namespace:
            return m.group(0)
        value = namespace[root]
        try:
            for attr in attrs:
                value = getattr(value, attr)
        except AttributeError:
            return m.group(0)
        return str(value)

    return _FIELD.sub(sub, text)


def expand_outside_program(text: str, namespace: dict) -> str:
    """``expand_fields`` everywhere except inside the program of ``python -c "<program>"``.

    A program's own f-strings (``f'device={dev}'``) must reach Python as written, even when the
    notebook happens to define a variable of the same name.
    """
    try:
        words = shlex.split(text, posix=False)  # keeps each word's quotes, as it appears in ``text``
    except ValueError:
        return expand_fields(text, namespace)
    for i, word in enumerate(words[:-1]):
        if word == "-c" and i >= 1 and words[i - 1].rsplit("/", 1)[-1].startswith("python"):
            program = words[i + 1]
            start = text.find(program, text.find("-c"))
            if start < 0:
                break
            end = start + len(program)
            return expand_fields(text[:start], namespace) + program + expand_fields(text[end:], namespace)
    return expand_fields(text, namespace)


def _allowed(result: CommandResult):
    """--allow-fail: the result is handed back, failed or not (launched with check=False); a timeout is said in one
    line (a failed exit shows in the output above)."""
    if isinstance(getattr(result, "error", None), LaunchTimeout):  # a Background has none
        print(f"[nbtools] --allow-fail: {str(result.error).splitlines()[0]}")
    return result


def run_written(text: str) -> CommandResult:
    """``%cmd``: run a written command (after ``{expr}`` expansion) the way this machine needs."""
    written = commands.parse(text)
    if written.background or written.fit:
        raise ParameterError("--background and --fit are %launch options (a launch that keeps running while the notebook "
                             "goes on; the learner's own job, shrunk to the visible cards)")
    s = session.current()  # what is not written comes from the open session, else the defaults
    info, device, timeout = (s.info, s.device_param, s.timeout_s) if s else (detect(), "auto", DEFAULT_TIMEOUT_S)
    real = commands.command_here(written, info, device)
    same = real.argv == written.argv and real.env == written.env
    shown = Shown(command=written.text if same else commands.shell_line(real.argv, real.env),
                  as_written=written.text, why=real.why_line,  # kept on the CommandResult (run_command builds it)
                  timeout_name="--timeout" if written.timeout else "timeout_s" if s else "the default timeout")
    result = run_command(real.argv, env=real.env, timeout=written.timeout or timeout, check=not written.allow_fail,
                         offline=not written.online, echo=shown)
    return _allowed(result) if written.allow_fail else result


def run_launch(text: str) -> CommandResult:
    """``r = %launch ASCEND_RT_VISIBLE_DEVICES=0,1 accelerate launch --num_processes 2 ... train_npu.py``: runs the
    written ``accelerate launch`` the way this machine needs it (what is not written comes from ``nbtools.setup``),
    prints what really runs and why, and returns its ``CommandResult``."""
    # The %launch magic itself (register): decided by decide.launch_spec, run by guarded.launch.
    written = (call := parse_launch(text)).command
    spec = launch_spec(call, timeout=written.timeout or FROM_SESSION, fit=written.fit)
    result = launch(spec, check=not written.allow_fail, offline=not written.online, background=written.background)
    return _allowed(result) if written.allow_fail else result


@magics_class
class CommandMagics(Magics):
    @line_cell_magic
    def cmd(self, line: str, cell: str | None = None):
        """Run a command as written: ``r = %cmd python --version``; ``%%cmd NAME`` + a command over lines."""
        if cell is None:
            return run_written(line)
        words = line.split()
        name = words.pop() if words and _NAME.match(words[-1]) and not words[-1].startswith("-") else None
        options = " ".join(words)
        if options and not options.startswith("--"):
            raise ParameterError(f"%%cmd {line.strip()!r}: expected `%%cmd [--timeout S] [--allow-fail] [--online] NAME`")
        body = expand_outside_program(cell, self.shell.user_ns)
        result = run_written(f"{options} {body}" if options else body)
        if name:
            self.shell.user_ns[name] = result
        return None


def register(ip) -> None:
    """Register the magics on an IPython shell and make ``nbtools`` importable by name in it."""
    import nbtools

    ip.register_magics(CommandMagics)
    ip.register_magic_function(run_launch, "line", "launch")
    ip.user_ns.setdefault("nbtools", nbtools)


def _reset_stream_locks() -> None:
    """In a process forked from the kernel (``notebook_launcher``'s ranks): free the output locks.

    ipykernel's ``OutStream`` guards its buffer with a lock that its IOPub thread also takes. A fork
    while that thread holds it hands the child a lock nobody will release, and the child's first
    print, or the flush every multiprocessing child does as it exits, waits forever: the launch
    hangs. The child has one thread, so resetting the lock there is safe.
    """
    for stream in (sys.stdout, sys.stderr):
        lock = getattr(stream, "_buffer_lock", None)  # ipykernel.iostream.OutStream (ipykernel 6.x, 7.x)
        reinit = getattr(lock, "_at_fork_reinit", None)
        if reinit is not None:
            reinit()


os.register_at_fork(after_in_child=_reset_stream_locks)  # once per process: the module is imported once
