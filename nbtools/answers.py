"""Run the exercise answers that are code, and check that each still does what its text says.

The 练习 cell of a notebook carries, in its metadata under ``nbtools.answers``, one entry per
exercise whose answer can be applied to the lesson mechanically::

    {"exercise": 4,
     "params": {"num_processes": 1},                   # optional: as `-p name=value`
     "edits": [{"cell": "loaded = dispatch_model(",   # the one code cell that contains this text
                "after": "loaded = dispatch_model(",  # insert after the line containing this text ...
                "code": 0}],                           # ... code block 0 of the answer, as the learner reads it
     "expect": {"bigmodel-exact": "failed: Tensor-likes are not close"}}

Edits: ``{"cell", "after", "code"}`` inserts lines after a line; ``{"cell", "replace", "code"}``
replaces text; ``{"new_cell_before", "code"}`` inserts a code cell before the one cell (of any
kind) containing that text. ``code`` is the index of a fenced block in that exercise's answer
(the part after ``<summary>答案</summary>``) or a literal text. Expectations per check id:
``passed``, ``skipped``, ``failed`` or ``failed: <regex>`` (searched in the failure's reason); the
key ``notebook`` expects the notebook's own status and error (an answer that stops the lesson
in a cell that is not a check).

Every answer becomes a copy of its notebook with the edits applied (and its parameters set in
the parameters cell), run like the lessons (runner.run_notebooks). An answer fails when the lesson
no longer has the text an edit needs, when its code block is gone, or when a check says
something else than expected: the exercise text and the lesson drifted apart.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from .errors import ParameterError

_HEADING = re.compile(r"^## 练习", re.M)
_ITEM = re.compile(r"^(\d+)\. ", re.M)
_FENCE = re.compile(r"^[ \t]*```[\w-]*\n(.*?)^[ \t]*```", re.M | re.S)
ANSWER_SUMMARY = "<summary>答案</summary>"


@dataclass
class Answer:
    notebook: Path
    exercise: int
    spec: dict
    variant: Path | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.notebook.stem} 练习 {self.exercise}"


def exercise_cell(nb):
    """The markdown cell holding the ``## 练习`` section (it may share the cell with ``## 小结``)."""
    return next((c for c in nb.cells if c.cell_type == "markdown" and _HEADING.search(c.source)), None)


def exercises_text(cell) -> str:
    return cell.source[_HEADING.search(cell.source).start():]


def answer_blocks(exercises_md: str, number: int) -> list[str]:
    """The fenced code blocks of exercise ``number``'s answer, dedented as a learner copies them."""
    starts = [(int(m.group(1)), m.start()) for m in _ITEM.finditer(exercises_md)]
    spans = {n: (s, starts[i + 1][1] if i + 1 < len(starts) else len(exercises_md)) for i, (n, s) in enumerate(starts)}
    if number not in spans:
        raise ParameterError(f"exercise {number} does not exist")
    item = exercises_md[slice(*spans[number])]
    if ANSWER_SUMMARY not in item:
        raise ParameterError(f"exercise {number} has no {ANSWER_SUMMARY}")
    answer = item.split(ANSWER_SUMMARY, 1)[1]
    return [_dedent(m.group(1)) for m in _FENCE.finditer(answer)]


def _dedent(block: str) -> str:
    return textwrap.dedent(block).rstrip("\n") + "\n"


def _code(edit: dict, blocks: list[str]) -> str:
    code = edit["code"]
    if isinstance(code, int):
        if code >= len(blocks):
            raise ParameterError(f"the answer has {len(blocks)} code block(s), the spec wants block {code}")
        return blocks[code]
    return code


def _one(cells, text: str, kind: str | None = "code"):
    found = [c for c in cells if (kind is None or c.cell_type == kind) and text in c.source]
    if len(found) != 1:
        where = "no" if not found else f"{len(found)}"
        raise ParameterError(f"{where} {kind or ''} cell(s) contain {text!r}: the lesson changed under the answer")
    return found[0]


def apply(nb, spec: dict, blocks: list[str]) -> None:
    """Apply one answer's edits and parameters to ``nb`` in place."""
    for edit in spec.get("edits", []):
        code = _code(edit, blocks)
        if "new_cell_before" in edit:
            target = _one(nb.cells, edit["new_cell_before"], kind=None)
            nb.cells.insert(nb.cells.index(target), nbformat.v4.new_code_cell(code.rstrip("\n")))
            continue
        cell = _one(nb.cells, edit["cell"])
        if "replace" in edit:
            if edit["replace"] not in cell.source:
                raise ParameterError(f"{edit['replace']!r} is not in the cell any more")
            cell.source = cell.source.replace(edit["replace"], code.rstrip("\n"), 1)
        else:
            lines = cell.source.split("\n")
            at = [i for i, line in enumerate(lines) if edit["after"] in line]
            if len(at) != 1:
                raise ParameterError(f"{len(at)} lines contain {edit['after']!r} (expected one)")
            indent = re.match(r"\s*", lines[at[0]]).group(0)
            new = [indent + line if line else line for line in code.rstrip("\n").split("\n")]
            cell.source = "\n".join(lines[: at[0] + 1] + new + lines[at[0] + 1 :])
    params = spec.get("params") or {}
    if params:
        cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
        cell.source += "\n" + "\n".join(f"{k} = {v!r}  # set by this answer" for k, v in params.items())


def collect(notebooks: list[Path], folder: Path) -> list[Answer]:
    """Every answer of ``notebooks``, each written as a variant notebook into ``folder``."""
    answers = []
    for path in notebooks:
        nb = nbformat.read(path, as_version=4)
        cell = exercise_cell(nb)
        specs = (cell.metadata.get("nbtools", {}).get("answers", []) if cell is not None else [])
        for k, spec in enumerate(specs):
            answer = Answer(path, int(spec["exercise"]), spec)
            variant = nbformat.read(path, as_version=4)
            try:
                apply(variant, spec, answer_blocks(exercises_text(cell), answer.exercise))
            except ParameterError as exc:
                answer.problems.append(str(exc))
            else:
                answer.variant = folder / f"{path.stem}__answer{answer.exercise}_{k}.ipynb"
                nbformat.write(variant, answer.variant)
            answers.append(answer)
    return answers


def judge(answer: Answer, verdicts: dict[str, tuple[str, str]]) -> None:
    """Compare the variant's check verdicts (id -> (status, reason)) with what the answer expects."""
    for check_id, want in answer.spec["expect"].items():
        status, reason = verdicts.get(check_id, ("missing", "the variant has no such check"))
        kind, _, pattern = want.partition(":")
        if status != kind.strip():
            answer.problems.append(f"{check_id}: expected {want!r}, got {status} ({reason[:300]})")
        elif pattern.strip() and not re.search(pattern.strip(), reason):
            answer.problems.append(f"{check_id}: {status}, but its reason does not match {pattern.strip()!r}: {reason[:300]}")


def run_answers(notebooks: list[Path], output_dir: Path, *, kernel: str, timeout: float | None, log=print) -> list[Answer]:
    from .runner import run_notebooks

    folder = Path(tempfile.mkdtemp(prefix="nbtools-answers-"))  # the variants; the executed copies go to output_dir
    try:
        answers = collect(notebooks, folder)
        runnable = [a for a in answers if a.variant is not None]
        report = run_notebooks([a.variant for a in runnable], output_dir, kernel=kernel, timeout=timeout, log=log) if runnable else None
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    for a in runnable:
        verdicts = {c.id: (c.status, c.reason) for c in report.checks if c.notebook == a.variant.name}
        for n in report.notebooks:
            if Path(n.path).name == a.variant.name:
                verdicts["notebook"] = (n.status, n.error)
                if n.output:  # a failed check's whole error, not only its first line
                    verdicts.update(_full_errors(output_dir / n.output, verdicts))
        judge(a, verdicts)
    return answers


def _full_errors(executed: Path, verdicts: dict) -> dict:
    from .checks import check_ids
    from .model import strip_ansi

    out = {}
    for cell in nbformat.read(executed, as_version=4).cells:
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        for cid in check_ids(cell.get("metadata", {}).get("tags")) if errors else ():
            status, _ = verdicts.get(cid, ("failed", ""))
            out[cid] = (status, f"{errors[0].get('ename')}: {strip_ansi(str(errors[0].get('evalue', '')))}")
    return out
