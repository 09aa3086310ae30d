"""The lines a launch's ranks print, read like the quick-start's `fuzzy='...'` expected blocks.

All ranks of an ``accelerate launch`` share one output pipe. Another rank's warning can land
between the main process's lines, and torch elastic prefixes a failing rank's lines with
``[rank1]:`` (``[default1]:`` with ``--tee``). ``keyed_lines`` keeps only the ``key=value`` lines
an expected block speaks about, prefixes removed, in the order they came; ``assert_block``
compares the block with exactly those lines, so a line printed twice (each process ran alone
and thought it was the main one) is still a mismatch.

``parse_kv`` (expected.py) strips the same prefixes when it reads ``key=value`` pairs.
"""

from __future__ import annotations

import re

from .expected import ANY_LINES, RANK_PREFIX, assert_matches

_KEY = re.compile(r"^\s*([A-Za-z_][\w.\-]*)=")


def strip_rank_prefix(text: str) -> str:
    """``text`` with the ``[rankN]:`` / ``[defaultN]:`` prefix removed from every line."""
    return "\n".join(RANK_PREFIX.sub("", line) for line in text.splitlines())


def block_keys(block: str) -> list[str]:
    """The keys an expected block's lines start with (``world=2`` -> ``world``), in order, once each."""
    keys: list[str] = []
    for line in block.splitlines():
        m = _KEY.match(line)
        if m and m.group(1) not in keys:
            keys.append(m.group(1))
    return keys


def keyed_lines(output: str, keys) -> str:
    """The lines of ``output`` that start with ``key=`` for one of ``keys``, prefixes removed, in order."""
    wanted = tuple(f"{k}=" for k in keys)
    lines = (line.strip() for line in strip_rank_prefix(output).splitlines())
    return "\n".join(line for line in lines if line.startswith(wanted))


def assert_block(block: str, output: str, what: str = "launch output") -> None:
    """Raise OutputMismatch unless the block's ``key=`` lines of ``output`` match ``block`` (xxx allowed).

    Lines about other keys, and other ranks' warnings, are ignored, as in the quick-start's
    ``fuzzy='...'`` blocks; every line the block names must appear exactly as often as it does there.
    """
    keys = block_keys(block)
    if not keys:
        raise ValueError(f"the expected block names no key=value line: {block!r}")
    if any(line.strip() == ANY_LINES for line in block.splitlines()):
        raise ValueError("assert_block already ignores other lines: leave '...' out of the block")
    assert_matches(block, keyed_lines(output, keys), what=f"{what} (its {', '.join(k + '=' for k in keys)} lines)")
