"""`python -m nbtools answers`: run the exercise answers that are code, and check that each still does what its text
says.

An exercise cell whose answer can be applied to the lesson mechanically carries it in its metadata,
under ``nbtools.answers`` (a list: one exercise may have several)::

    {"params": {"num_processes": 1},                   # optional: as `-p name=value`
     "edits": [{"cell": "loaded = dispatch_model(",   # the one code cell that contains this text
                "after": "loaded = dispatch_model(",  # insert after the line containing this text ...
                "code": 0}],                           # ... code block 0 of the answer, as the learner reads it
     "expect": {"bigmodel-exact": "failed: Tensor-likes are not close"}}

An answer that edits a ``%%writefile`` cell runs as the lesson tells a learner to (``same_kernel``): the lesson up
to the exercise, then the edited cell and every cell below it in the same kernel (``"fresh_kernel": true`` opts out).
Cells after the last check the answer expects a verdict of are left out (``without_tail``).

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

from .checks import check_ids, judge_checks, verdict
from .errors import ParameterError
from .lang import of_metadata
from .lint import exercise_cells, words

_FENCE = re.compile(r"^[ \t]*```[\w-]*\n(.*?)^[ \t]*```", re.M | re.S)

@dataclass
class Answer:
    notebook: Path
    exercise: int
    spec: dict
    variant: Path | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.notebook.stem} exercise {self.exercise}"


def answer_blocks(exercise_md: str, lang: str = "zh") -> list[str]:
    """The fenced code blocks of an exercise's answer, dedented as a learner copies them."""
    summary = words(lang)[2]
    if summary not in exercise_md:
        raise ParameterError(f"the exercise has no {summary}")
    answer = exercise_md.split(summary, 1)[1].split("</details>", 1)[0]  # not a fence after the fold
    return [textwrap.dedent(m.group(1)).rstrip("\n") + "\n" for m in _FENCE.finditer(answer)]


def _one(cells, text: str, kind: str | None = "code"):
    found = [c for c in cells if (kind is None or c.cell_type == kind) and text in c.source]
    if len(found) != 1:
        raise ParameterError(f"{len(found) or 'no'} {kind or ''} cell(s) contain {text!r}: "
                             "the lesson changed under the answer")
    return found[0]


def apply(nb, spec: dict, blocks: list[str]) -> None:
    """Apply one answer's edits and parameters to ``nb`` in place."""
    for edit in spec.get("edits", []):
        code = edit["code"]
        if isinstance(code, int) and code >= len(blocks):
            raise ParameterError(f"the answer has {len(blocks)} code block(s), the spec wants block {code}")
        code = blocks[code] if isinstance(code, int) else code
        if "new_cell_before" in edit:
            target = _one(nb.cells, edit["new_cell_before"], kind=None)
            nb.cells.insert(nb.cells.index(target), nbformat.v4.new_code_cell(code.rstrip("\n")))
            continue
        cell = _one(nb.cells, edit["cell"])
        if "replace" in edit:
            if (at := cell.source.find(edit["replace"])) < 0:
                raise ParameterError(f"{edit['replace']!r} is not in the cell any more")
            # a match that starts an indented line gives the code's further lines that indentation too (a learner's
            # block pasted into a loop body); the first line goes where the match was
            indent = cell.source[cell.source.rfind("\n", 0, at) + 1 : at]
            indent = indent if not indent.strip() else ""
            code = textwrap.indent(code.rstrip("\n"), indent).removeprefix(indent)
            cell.source = cell.source.replace(edit["replace"], code, 1)
        else:
            lines = cell.source.split("\n")
            at = [i for i, line in enumerate(lines) if edit["after"] in line]
            if len(at) != 1:
                raise ParameterError(f"{len(at)} lines contain {edit['after']!r} (expected one)")
            new = textwrap.indent(code.rstrip("\n"), re.match(r"\s*", lines[at[0]]).group(0))  # the line's indentation
            cell.source = "\n".join([*lines[: at[0] + 1], new, *lines[at[0] + 1 :]])
    if params := spec.get("params"):
        cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
        cell.source += "\n" + "\n".join(f"{k} = {v!r}  # set by this answer" for k, v in params.items())


def same_kernel(lesson, variant, spec: dict, exercise: int) -> None:
    """An answer that edits a ``%%writefile`` cell, run as the lesson tells a learner: the lesson up to the exercise
    first (its checks not judged), then, in the same kernel, the edited ``%%writefile`` cell and every cell below it. A
    module the kernel imported from the old script stays imported unless the lesson reloads it: that error shows here."""
    edited = [e["cell"] for e in spec.get("edits", []) if e.get("cell", "").startswith("%%writefile")]
    if not edited or spec.get("fresh_kernel"):
        return
    start = min(variant.cells.index(_one(variant.cells, text)) for text in edited)
    first = lesson.cells[:exercise]
    for i, c in enumerate(first):
        c.metadata["tags"] = [t for t in c.metadata.get("tags", []) if t == "parameters" or ":" not in t]
        c.id = f"first-{i}"
    variant.cells = first + variant.cells[start:]


def without_tail(variant, spec: dict) -> None:
    """Cells after the last check whose verdict the answer expects cannot change it: they are left out (the lesson's
    closing ``S.close()`` cell kept). An answer that expects the notebook's own status runs whole."""
    ids = set(spec["expect"]) - {"notebook"}
    tagged = [i for i, c in enumerate(variant.cells) if ids & set(check_ids(c.metadata.get("tags")))]
    if "notebook" in spec["expect"] or not tagged:
        return
    closing = [c for c in variant.cells[max(tagged) + 1:] if c.cell_type == "code" and "S.close()" in c.source]
    variant.cells = variant.cells[: max(tagged) + 1] + closing[-1:]


def collect(notebooks: list[Path], folder: Path) -> list[Answer]:
    """Every answer of ``notebooks``, each written as a variant notebook into ``folder``."""
    answers = []
    for path in notebooks:
        nb = nbformat.read(path, as_version=4)
        for number, index in exercise_cells(nb):
            cell = nb.cells[index]
            for k, spec in enumerate(cell.metadata.get("nbtools", {}).get("answers", [])):
                answer = Answer(path, number, spec)
                variant = nbformat.read(path, as_version=4)
                try:
                    apply(variant, spec, answer_blocks(cell.source, of_metadata(nb.metadata)))
                    lesson = nbformat.read(path, as_version=4)
                    apply(lesson, {"params": spec.get("params")}, [])  # the learner's parameters hold for the first run too
                    same_kernel(lesson, variant, spec, index)
                    without_tail(variant, spec)
                except ParameterError as exc:
                    answer.problems.append(str(exc))
                else:
                    answer.variant = folder / f"{path.stem}__answer{number}_{k}.ipynb"
                    nbformat.write(variant, answer.variant)
                answers.append(answer)
    return answers


def judge(answer: Answer, verdicts: dict[str, tuple[str, str]]) -> None:
    """Compare the variant's check verdicts (id -> (status, reason)) with what the answer expects."""
    for check_id, want in answer.spec["expect"].items():
        status, reason = verdicts.get(check_id) or verdict(None, check_id)  # the variant has no such check: missing
        kind, _, pattern = want.partition(":")
        if status != kind.strip():
            answer.problems.append(f"{check_id}: expected {want!r}, got {status} ({reason[:300]})")
        elif pattern.strip() and not re.search(pattern.strip(), reason):
            answer.problems.append(f"{check_id}: {status}, but its reason does not match {pattern.strip()!r}: {reason[:300]}")


def run_answers(notebooks: list[Path], output_dir: Path, *, kernel: str, timeout: float | None, log=print,
                kind: str | None = None) -> list[Answer]:
    """Run every answer of ``notebooks``; an answer whose spec lists ``devices`` (e.g. ``["npu", "cuda"]``:
    its checks are skipped on a CPU) runs only where the device ``kind`` is one of them."""
    from .runner import run_notebooks

    folder = Path(tempfile.mkdtemp(prefix="nbtools-answers-"))  # the variants; the executed copies go to output_dir
    try:
        answers = collect(notebooks, folder)
        for a in [a for a in answers if kind and kind not in a.spec.get("devices", [kind])]:
            log(f"not run here: {a.name} (its answer is for {', '.join(a.spec['devices'])}; this is a {kind})")
            answers.remove(a)
        runnable = [a for a in answers if a.variant is not None]
        report = run_notebooks([a.variant for a in runnable], output_dir, kernel=kernel, timeout=timeout) if runnable else None
        for a in runnable:  # inside the try: a variant that did not run is read from the folder, its cells unjudged
            result = next(n for n in report.notebooks if Path(n.path).name == a.variant.name)
            executed = output_dir / result.output if result.output else a.variant
            checks = judge_checks(nbformat.read(executed, as_version=4), a.variant.name, full=True)
            judge(a, {"notebook": (result.status, result.error), **{c.id: (c.status, c.reason) for c in checks}})
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return answers
