"""Every code cell means the same under IPython 8 (the Python 3.10 kernels) as under the IPython installed here.

IPython 8 strips doctest prompts (``>>> `` / ``... ``) from EVERY line of a cell whose second line is
``...`` (or whose first line starts with ``>>> ``): an expected block opened by ``f\"\"\"`` and then ``...``
silently loses all its ``...`` wildcard lines there, and the check fails for the learner on 3.10 only.
IPython 9 leaves such a cell alone. This test runs IPython 8's own ``TransformerManager`` (from its
wheel, or the installed IPython when that is 8) over every code cell of every notebook and compares
the result with the installed IPython's: the magics the series uses on purpose are transformed alike
by both, everything else must come out the same.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import nbformat
import pytest
from conftest import NOTEBOOKS, skip_outside_ci

# IPython 8 and the one requirement of it that IPython 9 dropped (the rest are installed with IPython 9)
IPYTHON8 = ("ipython>=8.30,<9", "decorator")

# Runs in a child interpreter with IPython 8 first on sys.path: transforms the cells read from stdin.
_TRANSFORM = r"""
import json, os, sys
if sys.argv[1:]:
    sys.path[:0] = sys.argv[1].split(os.pathsep)
import IPython
from IPython.core.inputtransformer2 import TransformerManager
assert IPython.version_info[0] == 8, IPython.__version__
cells = json.load(sys.stdin)
print(json.dumps({"version": IPython.__version__, "cells": [TransformerManager().transform_cell(c) for c in cells]}))
"""


def _code_cells() -> list[tuple[str, int, str]]:
    found = []
    for path in sorted(Path(NOTEBOOKS).glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        found += [(path.name, i, c.source) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    return found


@pytest.fixture(scope="session")
def ipython8_path(tmp_path_factory) -> str | None:
    """None when the installed IPython is 8 already; else IPython 8's wheels as sys.path entries (zip-importable)."""
    if int(metadata.version("ipython").split(".")[0]) == 8:
        return None
    dest = tmp_path_factory.mktemp("ipython8")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(dest), *IPYTHON8],
        capture_output=True,
        text=True,
    )
    wheels = sorted(str(w) for w in dest.glob("*.whl"))
    if proc.returncode != 0 or len(wheels) != len(IPYTHON8):
        skip_outside_ci(f"could not download {' '.join(IPYTHON8)} (needs the package index): {proc.stderr.strip()[-300:]}")
    return os.pathsep.join(wheels)


def transform_with_ipython8(sources: list[str], path: str | None) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-c", _TRANSFORM, *([path] if path else [])],
        input=json.dumps(sources),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(proc.stdout)["cells"]


def test_the_rule_is_ipython8s(ipython8_path):
    """The child really is IPython 8 and really strips a prompt-looking expected block (else the test proves nothing)."""
    old_way = 'nbtools.assert_matches(f"""\n...\nworld=2\n...\n""", r.output)\n'
    assert transform_with_ipython8([old_way], ipython8_path) == ['nbtools.assert_matches(f"""\n\nworld=2\n\n""", r.output)\n']


def test_every_code_cell_means_the_same_under_ipython8(ipython8_path):
    from IPython.core.inputtransformer2 import TransformerManager

    cells = _code_cells()
    assert len(cells) > 100, "the notebooks were not found"
    under8 = transform_with_ipython8([src for _, _, src in cells], ipython8_path)
    here = TransformerManager()
    changed = [
        f"{name} cell {i}:\n--- IPython 8 runs ---\n{got}\n--- IPython {metadata.version('ipython')} runs ---\n{want}"
        for (name, i, src), got in zip(cells, under8)
        if got != (want := here.transform_cell(src))
    ]
    assert not changed, "cells that IPython 8 changes (start the cell differently, e.g. `expected = f\"\"\"`):\n" + "\n".join(
        changed
    )
