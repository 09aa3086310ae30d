"""The exercise answers that are code: how they are applied to a lesson, and that every one still applies.

Running them is `python -m nbtools answers` (a README command, run by CI); here the parts in milliseconds.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from conftest import ROOT

from nbtools import ParameterError
from nbtools.answers import Answer, answer_blocks, apply, collect, judge
from nbtools.lint import exercise_cells
from nbtools.runner import discover

EXERCISE_1 = """### 练习 1

Change it.

<details><summary>提示</summary>

```python
hint_code()
```

</details>
<details><summary>答案</summary>

Add this:

   ```python
   with torch.no_grad():
       w.mul_(-1)
   ```

</details>
"""

EXERCISE_2 = """### 练习 2

Another.

<details><summary>答案</summary>

```shell
accelerate launch x.py
```

</details>
"""


def _lesson():
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("device = 'auto'\nnum_processes = 2", metadata={"tags": ["parameters"]}),
        nbformat.v4.new_markdown_cell("## 坑 3：fork"),
        nbformat.v4.new_code_cell("if True:\n    loaded = dispatch()\n    go(loaded)"),
        nbformat.v4.new_code_cell("budget = int(0.4 * size)"),
        nbformat.v4.new_markdown_cell(EXERCISE_1),
        nbformat.v4.new_code_cell(""),
    ]
    return nb


def test_answer_blocks_are_the_answers_code_dedented_not_the_hints():
    assert answer_blocks(EXERCISE_1) == ["with torch.no_grad():\n    w.mul_(-1)\n"]
    assert answer_blocks(EXERCISE_2) == ["accelerate launch x.py\n"]
    with pytest.raises(ParameterError, match="has no <summary>答案</summary>"):
        answer_blocks(EXERCISE_2.split("<details>")[0])


def test_apply_inserts_replaces_adds_a_cell_and_sets_parameters():
    nb = _lesson()
    spec = {
        "params": {"num_processes": 1},
        "edits": [
            {"cell": "loaded = dispatch()", "after": "loaded = dispatch()", "code": 0},
            {"cell": "budget = int(", "replace": "0.4 * size", "code": "0.25 * size"},
            {"new_cell_before": "## 坑 3", "code": "from accelerate import Accelerator; Accelerator()"},
        ],
    }
    apply(nb, spec, answer_blocks(EXERCISE_1))
    sources = [c.source for c in nb.cells]
    assert sources[0].endswith("num_processes = 1  # set by this answer")
    assert sources[1] == "from accelerate import Accelerator; Accelerator()" and sources[2] == "## 坑 3：fork"
    assert sources[3] == "if True:\n    loaded = dispatch()\n    with torch.no_grad():\n        w.mul_(-1)\n    go(loaded)"
    assert sources[4] == "budget = int(0.25 * size)"


def test_a_block_replacing_an_indented_line_keeps_that_indentation():
    """A multi-line answer put in place of lines inside a loop body stays inside it (07 练习 3)."""
    nb = _lesson()
    apply(nb, {"edits": [{"cell": "loaded = dispatch()", "replace": "loaded = dispatch()", "code": 0}]},
          answer_blocks(EXERCISE_1))
    assert nb.cells[2].source == "if True:\n    with torch.no_grad():\n        w.mul_(-1)\n    go(loaded)"


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"cell": "loaded = load()", "after": "x", "code": "y"}, "no code cell"),
        ({"cell": "budget = int(", "replace": "0.5 * size", "code": "y"}, "is not in the cell any more"),
        ({"cell": "loaded = dispatch()", "after": "loaded = dispatch()", "code": 3}, "has 1 code block"),
        ({"new_cell_before": "## 坑 9", "code": "y"}, "no  cell"),
    ],
)
def test_an_answer_whose_lesson_changed_fails(edit, message):
    with pytest.raises(ParameterError, match=message):
        apply(_lesson(), {"edits": [edit]}, answer_blocks(EXERCISE_1))


def test_judge_compares_status_and_reason():
    a = Answer(None, 1, {"expect": {"c1": "passed", "c2": "failed: not close", "c3": "failed", "notebook": "passed"}})
    judge(a, {"c1": ("passed", ""), "c2": ("failed", "AssertionError: Tensor-likes are close"), "c3": ("skipped", "no NPU"),
              "notebook": ("passed", "")})
    assert [p.split(":")[0] for p in a.problems] == ["c2", "c3"], a.problems


def test_judge_calls_a_check_the_variant_lacks_missing_as_the_one_judge_does(monkeypatch):
    monkeypatch.setenv("NBTOOLS_LANG", "en")
    a = Answer(None, 1, {"expect": {"gone": "passed"}})
    judge(a, {"notebook": ("passed", "")})
    assert a.problems == ["gone: expected 'passed', got missing (no cell is tagged check:gone)"], a.problems


def test_every_committed_answer_still_applies_to_its_lesson(tmp_path):
    answers = collect(discover(None), tmp_path)
    assert answers, "no notebook declares an answer to run"
    assert not [(a.name, a.problems) for a in answers if a.problems]
    for a in answers:
        assert a.spec["expect"], f"{a.name}: an answer that expects nothing checks nothing"


def test_an_answer_for_accelerators_only_is_left_out_on_a_cpu(tmp_path):
    """08's answers make FSDP checks fail on purpose; on a CPU those checks are skipped, so the answers are not
    run there (and not counted as passing): the run says so instead."""
    from nbtools.answers import run_answers

    said = []
    sharding = [p for p in discover([]) if p.name == "08_sharding.ipynb"]
    nb = nbformat.read(sharding[0], as_version=4)
    specs = [(n, s) for n, i in exercise_cells(nb) for s in nb.cells[i].metadata.get("nbtools", {}).get("answers", [])]
    assert specs and all("cpu" not in s.get("devices", ["cpu"]) for _, s in specs), specs  # every one for accelerators
    assert run_answers(sharding, tmp_path, kernel="python3", timeout=1, log=said.append, kind="cpu") == []
    assert [line.split(" (")[0] for line in said] == [f"not run here: 08_sharding exercise {n}" for n, _ in specs]


def test_the_readme_counts_the_exercises_and_the_answers_that_run():
    exercises = answered = 0
    for path in discover(None):
        nb = nbformat.read(path, as_version=4)
        for _, i in exercise_cells(nb):
            exercises += 1
            answered += bool(nb.cells[i].metadata.get("nbtools", {}).get("answers"))
    readme = " ".join((Path(ROOT) / "README.md").read_text(encoding="utf-8").split())
    assert (f"of the {exercises} exercises, {answered} have an answer that `nbtools answers` runs and "
            f"{exercises - answered} a prose one") in readme


def test_an_answer_to_a_writefile_cell_runs_in_the_lessons_kernel(tmp_path):
    """07 练习 1: a learner edits a %%writefile cell and re-runs it and the cells below, without a restart. The
    variant is the lesson up to the exercise (its checks not judged) and then, in the same kernel, the edited cell
    onwards, up to the last check the answer expects and the closing S.close() (cells between them left out)."""
    lesson = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    exercise = EXERCISE_1.replace("with torch.no_grad():\n       w.mul_(-1)", "X = 2")
    lesson.cells = [
        nbformat.v4.new_code_cell("num_processes = 2", metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell("%%writefile s.py\nX = 1"),
        nbformat.v4.new_code_cell("import s"),
        nbformat.v4.new_code_cell("nbtools.passed('c', str(s.X))", metadata={"tags": ["check:c", "needs:npu"]}),
        nbformat.v4.new_markdown_cell(exercise, metadata={"nbtools": {"answers": [
            {"params": {"num_processes": 1}, "edits": [{"cell": "%%writefile s.py", "replace": "X = 1", "code": 0}],
             "expect": {"c": "passed: 1"}}]}}),
        nbformat.v4.new_code_cell(""),
        nbformat.v4.new_code_cell("nbtools.passed('later', 'after the exercise')", metadata={"tags": ["check:later"]}),
        nbformat.v4.new_code_cell("S.close()"),
    ]
    path = tmp_path / "09_lesson.ipynb"
    nbformat.write(lesson, path)
    (answer,) = collect([path], tmp_path)
    assert not answer.problems, answer.problems
    cells = nbformat.read(answer.variant, as_version=4).cells
    sources = [c.source for c in cells]
    assert sources[:4] == [c.source + ("\nnum_processes = 1  # set by this answer" if i == 0 else "")
                           for i, c in enumerate(lesson.cells[:4])]  # the lesson up to the exercise, its parameters set
    assert sources[4:] == ["%%writefile s.py\nX = 2", "import s", "nbtools.passed('c', str(s.X))", "S.close()"]
    tags = [c.metadata.get("tags", []) for c in cells]
    assert tags[0] == ["parameters"] and tags[3] == [] and tags[6] == ["check:c", "needs:npu"]  # judged once, after the edit
    assert len({c.id for c in cells}) == len(cells)
    fresh = {**lesson.cells[4].metadata["nbtools"]["answers"][0], "fresh_kernel": True}
    lesson.cells[4].metadata["nbtools"]["answers"] = [fresh]
    nbformat.write(lesson, path)
    (answer,) = collect([path], tmp_path)
    once = [c.source for c in nbformat.read(answer.variant, as_version=4).cells]  # opted out: one run, its tail cut
    assert once == [sources[0], "%%writefile s.py\nX = 2", "import s", "nbtools.passed('c', str(s.X))", "S.close()"]
