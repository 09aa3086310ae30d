"""Compare an output with an expected block, using the quick-start's doc-test rules.

- ``xxx`` inside an expected line matches any text within that line;
- a line that is exactly ``...`` matches any number of lines (zero included);
- trailing whitespace is ignored; blank lines in the actual output are ignored.

And ``parse_kv``: the ``key=value`` / ``key: value`` lines the quick-start's commands print
(``[rankN]:`` prefixes removed). Version comparison lives in device.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import OutputMismatch
from .lang import msg

ANY_LINES = "..."
IN_LINE = "xxx"

KEY = r"[A-Za-z_][\w.\-]*"  # a key of a key=value line (ranks.block_keys reads the same)
_PAIR = re.compile(rf"({KEY})=(.*?)(?=\s+{KEY}=|\s*$)")
# What torch elastic puts before each line of a rank (`--tee`, `--role`): [rank1]: / [default0]:
RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]:\s?")
_KV_LINE = re.compile(rf"^\s*{KEY}=.*$")
_COLON_LINE = re.compile(rf"^\s*({KEY}):\s+(\S.*?)\s*$")  # `is_available: True` (one pair a line)


def _lines(text: str) -> list[str]:
    return [ln.rstrip() for ln in text.strip("\n").splitlines() if ln.strip()]  # blank lines are ignored


@dataclass
class Match:
    ok: bool
    expected: list[str]
    actual: list[str]
    exp_at: int = 0  # first expected line that could not be matched
    act_at: int = 0  # where in the actual output that happened

    def __bool__(self) -> bool:
        return self.ok

    def report(self, width: int = 60) -> str:
        """Expected and actual side by side, the first differing line marked with '>>'."""
        if self.ok:
            return msg("expected.same")
        rows = [f"   {msg('expected.expected'):<{width}} | {msg('expected.actual')}", "   " + "-" * width + "-+-" + "-" * width]
        start = max(0, min(self.exp_at, self.act_at) - 3)
        for i in range(start, max(len(self.expected), len(self.actual), self.act_at + 1)):
            e = self.expected[i] if i < len(self.expected) else ""
            a = self.actual[i] if i < len(self.actual) else ""
            mark = ">> " if i == self.act_at else "   "
            rows.append(f"{mark}{e[:width]:<{width}} | {a[:width]}")
            if i - start > 30:
                rows.append("   ...")
                break
        want = self.expected[self.exp_at] if self.exp_at < len(self.expected) else msg("expected.block_ended")
        got = self.actual[self.act_at] if self.act_at < len(self.actual) else msg("expected.output_ended")
        rows.append(msg("expected.first_difference", line=self.exp_at + 1, want=repr(want), at=self.act_at + 1, got=repr(got)))
        return "\n".join(rows)


def match(expected: str, actual: str) -> Match:
    """Does ``actual`` match the ``expected`` block (the quick-start's rules)? Returns a truthy/falsy Match."""
    exp, act = _lines(expected), _lines(actual)
    # reach[i]: the j where exp[:i] matches act[:j] (forward, so a failure can say how far it got)
    reach = [{0}]
    for line in exp:
        if line.strip() == ANY_LINES:  # '...' swallows act[j:k] for any k >= j
            reach.append(set(range(min(reach[-1]), len(act) + 1)) if reach[-1] else set())
        else:  # xxx matches any text within the line
            rx = re.compile(".*".join(re.escape(p) for p in line.split(IN_LINE)) + r"\s*")
            reach.append({j + 1 for j in reach[-1] if j < len(act) and rx.fullmatch(act[j])})
    if len(act) in reach[-1]:
        return Match(True, exp, act, len(exp), len(act))
    exp_at = max(i for i, js in enumerate(reach) if js)
    # all expected lines matched and the output has more: where it goes on; else where the next line was missed
    return Match(False, exp, act, exp_at, max(reach[-1]) if exp_at == len(exp) else min(reach[exp_at]))


def assert_matches(expected: str, actual: str, what: str | None = None) -> None:
    """Raise OutputMismatch (an AssertionError) with a side-by-side view when they differ."""
    if not (m := match(expected, actual)):
        raise OutputMismatch(msg("expected.mismatch", what=what or msg("expected.output"), report=m.report()))


def parse_kv(text: str) -> dict[str, str]:
    """Pairs from the lines of ``text`` that are made only of them; later lines win.

    - ``key=value`` pairs, several a line (``a=1 b=[1, 2]``), also ``key= value`` (``torch= 2.9.0``);
    - ``key: value``, one a line (``is_available: True``); the key is one word, so prose such as
      ``- PyTorch accelerator: N/A`` is not read.
    A leading ``[rankN]:`` prefix is dropped.
    """
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = RANK_PREFIX.sub("", line)
        if _KV_LINE.match(line):
            pairs = _PAIR.findall(line.strip())
            if pairs and "".join(f"{k}={v}" for k, v in pairs).replace(" ", "") == line.strip().replace(" ", ""):
                out.update({k: v.strip() for k, v in pairs})
        elif m := _COLON_LINE.match(line):
            out[m.group(1)] = m.group(2)
    return out
