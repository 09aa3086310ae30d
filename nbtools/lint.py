"""`python -m nbtools check`: the notebooks are committed clean and tagged right.

Rules: valid nbformat 4 (4.5: every cell has an id); no outputs, execution counts or papermill
metadata; kernelspec `python3`; exactly one `parameters` cell; `import nbtools` before the first
`nbtools.`; every exercise in its own markdown cell (`### 练习 N`, after the section it practises) with
its collapsed hint and answer (`<summary>提示</summary>`, `<summary>答案</summary>`) and an empty code cell
below it; at most 10,000 characters of prose outside those folded blocks; no `!cmd` / `%pip` / `%%bash` (their failures
do not fail a run: use `%cmd` or nbtools.run_command); every quick-start check id tagged (`check:<id>`)
on exactly one code cell across the series, and that cell gives its verdict with passed()/skipped();
an assertion message, an output label or a check id quoted in backticks in the prose (answers included) is
one that a code cell of the series or nbtools itself produces.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat

from .checks import SEED_CHECKS, check_ids
from .lang import msg, of_metadata

_SHELL = re.compile(r"^\s*(!|%pip\b|%conda\b|%%bash\b|%%sh\b|%%script\b|%system\b|%sx\b|%%system\b)", re.MULTILINE)
_IMPORT = re.compile(r"^[ \t]*import nbtools\b", re.MULTILINE)  # at the top, or in a try: that explains a missing install
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
    if m := _SHELL.search(cell.source):
        problems.append(
            f"{where}: shell escape {m.group(1)!r}: its failure would not fail the run; use %cmd or nbtools.run_command([...])"
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
    if nb.get("nbformat_minor", 0) >= 5:  # nbformat.read adds missing ids (with a warning): look at the file
        cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
        if missing := [i for i, cell in enumerate(cells) if "id" not in cell]:
            problems.append(f"{name}: cells {missing} have no id, which nbformat 4.5 requires; run nbformat's normalize")
    try:
        nbformat.validate(nb)
    except nbformat.ValidationError as exc:
        problems.append(f"{name}: invalid nbformat: {str(exc).splitlines()[0]}")
    if (kernel := nb.metadata.get("kernelspec", {}).get("name")) != "python3":
        problems.append(f"{name}: kernelspec name is {kernel!r}, expected 'python3'")
    if "papermill" in nb.metadata:
        problems.append(f"{name}: notebook metadata holds papermill run data; save it clean")
    for i, cell in enumerate(nb.cells):
        problems += _cell_problems(f"{name} cell {i}", cell, claims)
    if (n_params := sum("parameters" in cell.get("metadata", {}).get("tags", []) for cell in nb.cells)) != 1:
        problems.append(f"{name}: {n_params} cells tagged 'parameters', expected exactly 1")
    problems += [f"{name}: {p}" for p in exercise_problems(nb)]
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    uses = next((i for i, src in enumerate(code) if re.search(r"\bnbtools\.", src)), None)
    imports = next((i for i, src in enumerate(code) if _IMPORT.search(src)), None)
    if uses is not None and (imports is None or imports > uses):
        problems.append(f"{name}: uses nbtools. before any `import nbtools` (%load_ext injects the name, a "
                        "learner's own script does not): import it where the setup cell calls nbtools.setup")
    return problems, claims


_FOLDED = re.compile(r"<details>.*?</details>", re.S)
PROSE_LIMIT = 10_000  # characters of markdown a learner reads, outside the folded hints and answers
# the same reading in English takes about twice the characters (the English edition's twins: 1.8 to 2.0 times)
PROSE_LIMITS = {"zh": PROSE_LIMIT, "en": 2 * PROSE_LIMIT}


def words(lang: str) -> tuple[str, str, str]:
    """An exercise's heading word (``### 练习 N``; ``### Exercise N`` in English), its hint's and answer's summaries."""
    word, hint, answer = (msg(f"lint.{k}", lang) for k in ("exercise", "hint", "answer"))
    return word, f"<summary>{hint}</summary>", f"<summary>{answer}</summary>"


def exercise_cells(nb) -> list[tuple[int, int]]:
    """(exercise number, cell index) of every exercise cell: a markdown cell that starts ``### 练习 N``
    (``### Exercise N`` in an English notebook: nbtools.lang)."""
    heading = re.compile(rf"^### {words(of_metadata(nb.metadata))[0]} (\d+)", re.M)
    return [(int(m.group(1)), i) for i, c in enumerate(nb.cells)
            if c.cell_type == "markdown" and (m := heading.match(c.source))]


def exercise_problems(nb) -> list[str]:
    """Each exercise is its own markdown cell (``### 练习 N``, numbered 1, 2, ... in order) with its folded
    hint and answer, sharing the cell with no section, followed by an empty code cell to work in."""
    found, (word, *summaries) = exercise_cells(nb), words(of_metadata(nb.metadata))
    if not found:
        return [f"no exercise: a markdown cell starting '### {word} 1' after the section it practises"]
    out = []
    if [n for n, _ in found] != list(range(1, len(found) + 1)):
        out.append(f"exercises numbered {[n for n, _ in found]}, expected 1 to {len(found)} in order")
    for number, i in found:
        source = nb.cells[i].source
        if missing := [s for s in summaries if s not in source]:
            out.append(f"exercise {number} has no {' / '.join(missing)} below it (a collapsed <details> block)")
        shown = _FOLDED.sub("", source)  # a `# comment` inside a folded answer's code is not a heading
        if len(re.findall(rf"^### {word} \d", shown, re.M)) > 1 or re.search(rf"^#{{1,3}} (?!{word})", shown, re.M):
            out.append(f"exercise {number} shares its cell with another exercise or a section: one exercise per cell")
        after = nb.cells[i + 1] if i + 1 < len(nb.cells) else None
        if after is None or after.cell_type != "code" or after.source.strip():
            out.append(f"exercise {number} is not followed by an empty code cell to work in")
    if orphans := [i for i, c in enumerate(nb.cells) if c.get("metadata", {}).get("nbtools", {}).get("answers")
                   and i not in {i for _, i in found}]:
        out.append(f"cells {orphans} carry nbtools.answers but are no exercise cell: `nbtools answers` never runs them")
    limit = PROSE_LIMITS[of_metadata(nb.metadata)]
    if (chars := sum(len(_FOLDED.sub("", c.source)) for c in nb.cells if c.cell_type == "markdown")) > limit:
        out.append(f"{chars:,} characters of prose outside the folded hints and answers (at most {limit:,}): "
                   "cut, or move to the appendix")
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
    for cid in [*SEED_CHECKS, *(c for c in claims if c not in SEED_CHECKS)]:  # a quick-start check must be there
        if len(where := claims.get(cid, [])) != 1:
            what = "quick-start check" if cid in SEED_CHECKS else "check"
            problems.append(f"{what} {cid}: tagged on {len(where)} cells ({', '.join(where) or 'none'}), expected exactly 1")
    return problems + quote_problems(paths, set(claims))


_QUOTE = re.compile(r"`([^`\n]+)`")
_LABEL = re.compile(r"^[^\s`()=\[\]]{1,2}[^`()=\[\]]{0,22}[:：]$")  # `工作文件夹：`, `# why:`: a label, not code
_CHECK_ID = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)+$")


def quote_problems(paths: list[Path], check_ids: set[str]) -> list[str]:
    """Backticked quotes in the prose (answers included) that nothing in the series produces: an assertion
    message (`... != ...`), a label an output starts with (`工作文件夹：`), a check id. What produces them
    is the code cells of the series and nbtools itself (the setup cell's lines, the launcher's)."""
    cells, here = {p: nbformat.read(p, as_version=4).cells for p in paths}, Path(__file__).parent
    produced = "\n".join([c.source for p in paths for c in cells[p] if c.cell_type == "code"]
                         + [f.read_text(encoding="utf-8") for f in [*here.glob("*.py"), *here.glob("messages/*.json")]])
    prefixes = {cid.split("-")[0] for cid in check_ids}
    problems = []
    for p in paths:
        for i, cell in enumerate(cells[p]):
            if cell.cell_type != "markdown":
                continue
            for quote in _QUOTE.findall(cell.source):
                message = re.sub(r"^\w*(Error|Exception):\s*", "", quote).strip()
                if " != " in message and not re.search(r"\w\s*=\s|\bif\b", message):
                    kind = "assertion message"
                elif _LABEL.match(quote) and not re.match(r"(for|if|elif|else|while|with|def|class|try|except)\b", quote):
                    kind, message = "label", quote
                elif _CHECK_ID.match(quote) and quote.split("-")[0] in prefixes and quote not in check_ids:
                    kind, message = "check id", quote
                else:
                    continue
                if message not in produced:
                    problems.append(f"{p.name} cell {i}: quotes the {kind} `{quote}`, which no cell of the series "
                                    "and no line of nbtools produces (renamed or translated since?)")
    return problems
