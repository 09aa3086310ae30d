"""The hot path of a ``%launch`` stays short (issue 59): one decider, one runner.

The second ``%launch`` of a session (the probe and the catalogues cached, as in a kernel after its first launch), run
through IPython's own ``run_line_magic`` as a kernel runs a cell's ``%launch``, is profiled with ``sys.setprofile``: every Python frame whose code lives under ``nbtools/`` is counted, by module and by
function (comprehensions and generator expressions are not functions: Python 3.12 inlines comprehensions; nor are the
methods ``dataclasses`` generates, whose code is not in nbtools). A launch deciding itself in one module and running in another touches few of each; a decision spread over
many modules (a reader here, a route rule there, a why line composed from variables read back) shows up at once.
"""

from __future__ import annotations

import sys
from pathlib import Path

from IPython.core.interactiveshell import InteractiveShell

import nbtools

PACKAGE = str(Path(nbtools.__file__).resolve().parent)
NOT_FUNCTIONS = ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>")
MAX_MODULES = 5  # magics, decide, guarded, diagnose, lang (10 before issue 59)
MAX_FUNCTIONS = 35  # 49 before issue 59 (see README, "The path of a %launch")


def profiled(fn) -> tuple[set[str], set[tuple[str, str]]]:
    """(modules, (module, function)) of nbtools whose Python frames ``fn()`` entered, in this thread."""
    modules, functions = set(), set()

    def seen(frame, event, _arg):
        if event == "call":
            path = frame.f_code.co_filename
            if path.startswith(PACKAGE) and frame.f_code.co_name not in NOT_FUNCTIONS:
                name = Path(path).stem
                modules.add(name)
                functions.add((name, frame.f_code.co_qualname))

    sys.setprofile(seen)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return modules, functions


def test_a_launch_runs_in_few_modules_and_functions(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    S = nbtools.setup(num_processes=1, work_dir=str(tmp_path / "work"))  # a notebook's session (probe cached on disk)
    try:
        (S.work / "hello.py").write_text("print('rank says hello')\n", encoding="utf-8")
        line = "accelerate launch --num_processes 1 hello.py"
        ip = InteractiveShell.instance()
        ip.run_line_magic("load_ext", "nbtools")
        first = ip.run_line_magic("launch", line)  # the first launch fills every cache (probe, catalogue, config file)
        modules, functions = profiled(lambda: ip.run_line_magic("launch", line))
    finally:
        S.close()
        InteractiveShell.clear_instance()
    out = capsys.readouterr().out
    assert first.ok and "rank says hello" in out
    listing = "\n".join(f"  {m}.{f}" for m, f in sorted(functions))
    print(f"{len(modules)} modules, {len(functions)} functions:\n{listing}", file=sys.stderr)
    assert len(modules) <= MAX_MODULES, f"a %launch ran in {len(modules)} nbtools modules: {sorted(modules)}\n{listing}"
    assert len(functions) <= MAX_FUNCTIONS, f"a %launch ran {len(functions)} nbtools functions:\n{listing}"
