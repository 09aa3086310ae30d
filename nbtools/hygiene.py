"""`python -m nbtools check`: the notebooks are committed clean and tagged right.

Rules: valid nbformat 4; no outputs, execution counts or papermill metadata; kernelspec
`python3`; exactly one `parameters` cell; `import nbtools` before the first `nbtools.`; every exercise
under '## 练习' followed by its collapsed hint and answer (`<summary>提示</summary>`, `<summary>答案</summary>`); no `!cmd` / `%pip` / `%%bash` (their failures do
not fail a run: use nbtools.run); every quick-start check id tagged (`check:<id>`) on exactly one
code cell across the series, and that cell prints its verdict with passed()/skipped().
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat

from .checks import SEED_CHECKS, check_ids

_SHELL = re.compile(r"^\s*(!|%pip\b|%conda\b|%%bash\b|%%sh\b|%%script\b|%system\b|%sx\b|%%system\b)", re.MULTILINE)
_IMPORT = re.compile(r"^import nbtools\b", re.MULTILINE)
_NAME = re.compile(r"^\d\d[a-z]?_[a-z0-9_]+\.ipynb$")


def _cell_problems(where: str, cell, claims: dict[str, list[str]]) -> list[str]:
    """One cell's problems; the check ids it claims are added to ``claims``."""
    problems = []
    meta = cell.get("metadata", {})
    if "papermill" in meta or "execution" in meta:
        problems.append(f"{where}: carries run metadata (papermill/execution)")
    ids = check_ids(meta.get("tags", []))
    if cell.cell_type != "code":
        return problems + ([f"{where}: check tag on a {cell.cell_type} cell"] if ids else [])
    if cell.get("outputs"):
        problems.append(f"{where}: has outputs; clear them before committing")
    if cell.get("execution_count") is not None:
        problems.append(f"{where}: has an execution count; clear it before committing")
    m = _SHELL.search(cell.source)
    if m:
        problems.append(
            f"{where}: shell escape {m.group(1)!r}: its failure would not fail the run; use nbtools.run_command([...])"
        )
    for cid in ids:
        claims.setdefault(cid, []).append(where)
        if f'"{cid}"' not in cell.source and f"'{cid}'" not in cell.source:
            problems.append(f"{where}: tagged check:{cid} but never calls passed/skipped with {cid!r}")
    return problems


def check_notebook(path: Path) -> tuple[list[str], dict[str, list[str]]]:
    """Problems of one notebook, and the check ids it claims (id -> [where])."""
    problems: list[str] = []
    claims: dict[str, list[str]] = {}
    name = path.name
    if not _NAME.match(name):
        problems.append(f"{name}: file name should look like NN_slug.ipynb or NNb_slug.ipynb (lowercase, underscores)")
    try:
        nb = nbformat.read(path, as_version=nbformat.NO_CONVERT)
    except Exception as exc:
        return [f"{name}: cannot be read as a notebook: {exc}"], claims
    if nb.get("nbformat") != 4:
        problems.append(f"{name}: nbformat {nb.get('nbformat')}, expected 4")
    try:
        nbformat.validate(nb)
    except nbformat.ValidationError as exc:
        problems.append(f"{name}: invalid nbformat: {str(exc).splitlines()[0]}")
    kernel = nb.metadata.get("kernelspec", {}).get("name")
    if kernel != "python3":
        problems.append(f"{name}: kernelspec name is {kernel!r}, expected 'python3'")
    if "papermill" in nb.metadata:
        problems.append(f"{name}: notebook metadata holds papermill run data; save it clean")
    n_params = 0
    for i, cell in enumerate(nb.cells):
        n_params += "parameters" in cell.get("metadata", {}).get("tags", [])
        problems += _cell_problems(f"{name} cell {i}", cell, claims)
    if n_params != 1:
        problems.append(f"{name}: {n_params} cells tagged 'parameters', expected exactly 1")
    problems += [f"{name}: {p}" for p in exercise_problems(nb)]
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    uses = next((i for i, src in enumerate(code) if re.search(r"\bnbtools\.", src)), None)
    imports = next((i for i, src in enumerate(code) if _IMPORT.search(src)), None)
    if uses is not None and (imports is None or imports > uses):
        problems.append(f"{name}: uses nbtools. before any `import nbtools` (%load_ext injects the name, a "
                        "learner's own script does not): import it where the setup cell calls nbtools.setup")
    return problems, claims


_EXERCISES = re.compile(r"^## 练习\s*$", re.MULTILINE)
_ITEM = re.compile(r"^(\d+)\. ", re.MULTILINE)
_ANSWER = ("<summary>提示</summary>", "<summary>答案</summary>")


def exercise_problems(nb) -> list[str]:
    """Every numbered exercise under '## 练习' has its hint and its answer, collapsed, right below it."""
    cells = [c for c in nb.cells if c.cell_type == "markdown" and _EXERCISES.search(c.source)]
    if not cells:
        return ["no '## 练习' section"]
    text = cells[-1].source[_EXERCISES.search(cells[-1].source).end():]
    text = re.split(r"^## ", text, maxsplit=1, flags=re.MULTILINE)[0]  # up to the next section, if any
    items = list(_ITEM.finditer(text))
    if not items:
        return ["'## 练习' lists no numbered exercise"]
    out = []
    for k, m in enumerate(items):
        body = text[m.end():items[k + 1].start() if k + 1 < len(items) else len(text)]
        missing = [s for s in _ANSWER if s not in body]
        if missing:
            out.append(f"exercise {m.group(1)} has no {' / '.join(missing)} below it (a collapsed <details> block)")
    return out


def check_series(folder: Path) -> list[str]:
    paths = sorted(folder.glob("*.ipynb"))
    if not paths:
        return [f"no notebooks in {folder}"]
    problems: list[str] = []
    claims: dict[str, list[str]] = {}
    for p in paths:
        probs, mine = check_notebook(p)
        problems.extend(probs)
        for cid, where in mine.items():
            claims.setdefault(cid, []).extend(where)
    for cid in SEED_CHECKS:
        where = claims.get(cid, [])
        if len(where) != 1:
            problems.append(
                f"quick-start check {cid}: tagged on {len(where)} cells ({', '.join(where) or 'none'}), expected exactly 1"
            )
    for cid, where in claims.items():
        if cid not in SEED_CHECKS and len(where) != 1:
            problems.append(f"check {cid}: tagged on {len(where)} cells ({', '.join(where)}), expected exactly 1")
    return problems
