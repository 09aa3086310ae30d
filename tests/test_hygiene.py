"""`python -m nbtools check` on the committed series and on deliberately dirty copies."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from conftest import NOTEBOOKS

from nbtools.checks import SEED_CHECKS
from nbtools.lint import PROSE_LIMIT, check_series, exercise_cells


def test_committed_series_is_clean():
    assert check_series(Path(NOTEBOOKS)) == []


def test_cli_check_exits_zero_on_the_series():
    proc = subprocess.run([sys.executable, "-m", "nbtools", "check", NOTEBOOKS], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


@pytest.fixture
def copy(tmp_path):
    dst = tmp_path / "notebooks"
    shutil.copytree(NOTEBOOKS, dst)
    return dst


def _edit(path: Path, fn) -> None:
    nb = nbformat.read(path, as_version=4)
    fn(nb)
    nbformat.write(nb, path)


def _first(folder: Path) -> Path:
    return sorted(folder.glob("*.ipynb"))[0]


def _code(nb):
    return next(c for c in nb.cells if c.cell_type == "code" and "parameters" not in c.metadata.get("tags", []))


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda nb: _code(nb).outputs.append(nbformat.v4.new_output("stream", text="x")), "has outputs"),
        (lambda nb: _code(nb).__setitem__("execution_count", 3), "execution count"),
        (lambda nb: nb.metadata.__setitem__("papermill", {}), "papermill run data"),
        (lambda nb: nb.metadata["kernelspec"].__setitem__("name", "python3-npu"), "kernelspec name"),
        (lambda nb: nb.cells.append(nbformat.v4.new_code_cell("x = 1", metadata={"tags": ["parameters"]})), "2 cells tagged 'parameters'"),
        (lambda nb: [c.metadata.__setitem__("tags", []) for c in nb.cells if "parameters" in c.metadata.get("tags", [])],
         "0 cells tagged 'parameters'"),
        (lambda nb: nb.cells.append(nbformat.v4.new_code_cell("!accelerate launch x.py")), "shell escape '!'"),
        (lambda nb: nb.cells.append(nbformat.v4.new_code_cell("%pip install accelerate")), "shell escape '%pip'"),
        (lambda nb: [c.__setitem__("source", c.source.replace("import nbtools\n", "")) for c in nb.cells if c.cell_type == "code"],
         "uses nbtools. before any `import nbtools`"),
        (lambda nb: _exercise(nb, 1).__setitem__("source", _exercise(nb, 1).source.replace("<summary>答案</summary>", "")),
         "exercise 1 has no <summary>答案</summary> below it"),
        (lambda nb: nb.cells.__setitem__(_at(nb, 1) + 1, nbformat.v4.new_code_cell("# my work")),
         "exercise 1 is not followed by an empty code cell to work in"),
        (lambda nb: _exercise(nb, 1).__setitem__("source", _exercise(nb, 1).source + "\n## 小结\n\n- done\n"),
         "exercise 1 shares its cell with another exercise or a section"),
        (lambda nb: _exercise(nb, 2).__setitem__("source", _exercise(nb, 2).source.replace("### 练习 2", "### 练习 3", 1)),
         "exercises numbered [1, 3"),
        (lambda nb: nb.cells[0].metadata.__setitem__("nbtools", _exercise(nb, 1).metadata.get("nbtools") or {"answers": [{}]}),
         "cells [0] carry nbtools.answers but are no exercise cell"),
        (lambda nb: _exercise(nb, 1).__setitem__("source", _exercise(nb, 1).source.replace(
            "</details>", "\n```shell\n# a comment in an answer is no heading\n```\n</details>", 1)), None),
        (lambda nb: nb.cells.append(nbformat.v4.new_markdown_cell("长" * (PROSE_LIMIT + 1))),
         f"characters of prose outside the folded hints and answers (at most {PROSE_LIMIT:,})"),
        (lambda nb: nb.cells.append(nbformat.v4.new_markdown_cell("<details><summary>答案</summary>" + "长" * (PROSE_LIMIT + 1) + "</details>")),
         None),
    ],
)
def test_each_rule_catches_its_defect(copy, mutate, expected):
    """Each rule, broken once, is reported; a long answer folded under <details> is not prose (expected None)."""
    _edit(_first(copy), mutate)
    problems = check_series(copy)
    if expected is None:
        assert problems == [], problems
    else:
        assert any(expected in p for p in problems), problems


def _at(nb, number: int) -> int:
    return dict(exercise_cells(nb))[number]


def _exercise(nb, number: int):
    return nb.cells[_at(nb, number)]


def test_a_cell_without_an_id_is_reported(copy):
    # nbformat.write adds missing ids, so the file is edited as JSON, as an old editor would leave it
    path = next(p for p in sorted(copy.glob("*.ipynb")) if json.loads(p.read_text(encoding="utf-8"))["nbformat_minor"] >= 5)
    raw = json.loads(path.read_text(encoding="utf-8"))
    del raw["cells"][2]["id"]
    path.write_text(json.dumps(raw, ensure_ascii=False, indent=1), encoding="utf-8")
    assert f"{path.name}: cells [2] have no id, which nbformat 4.5 requires; run nbformat's normalize" in check_series(copy)


def test_a_seed_id_tagged_twice_or_never_is_reported(copy):
    seed_tags = {f"check:{cid}" for cid in SEED_CHECKS}
    first = next(p for p in sorted(copy.glob("*.ipynb")) if any(
        seed_tags & set(c.metadata.get("tags", [])) for c in nbformat.read(p, as_version=4).cells))
    nb = nbformat.read(first, as_version=4)
    tagged = next(c for c in nb.cells if seed_tags & set(c.metadata.get("tags", [])))
    cid = next(t for t in tagged.metadata["tags"] if t in seed_tags)[len("check:"):]
    nb.cells.append(nbformat.v4.new_code_cell(f"nbtools.passed({cid!r})", metadata={"tags": [f"check:{cid}"]}))
    nbformat.write(nb, first)
    assert any(f"quick-start check {cid}: tagged on 2 cells" in p for p in check_series(copy))
    nb.cells = [c for c in nb.cells if f"check:{cid}" not in c.metadata.get("tags", [])]
    nbformat.write(nb, first)
    assert any(f"quick-start check {cid}: tagged on 0 cells" in p for p in check_series(copy))


@pytest.mark.parametrize("quote, kind", [("`DDP != 1 process`", "assertion message"), ("`work dir:`", "label"),
                                         ("`acc-lunch`", "check id")])
def test_a_stale_quote_in_the_prose_is_reported(copy, quote, kind):
    """A message, a label or a check id quoted in a 练习 answer or the prose must be one the series produces:
    renamed or translated since, the quote is reported; the same quote of a real one is not."""
    path = copy / "01b_training_right.ipynb"
    nb = nbformat.read(path, as_version=4)
    exercises = _exercise(nb, 1)
    exercises.source += f"\n\n上面失败时会看到 {quote}。\n"
    nbformat.write(nb, path)
    assert any(f"quotes the {kind} {quote}" in p for p in check_series(copy)), check_series(copy)
    exercises.source = exercises.source.replace(quote, {"check id": "`acc-launch`", "label": "`工作文件夹：`"}.get(
        kind, "`DDP != 单进程`"))
    nbformat.write(nb, path)
    assert check_series(copy) == []
