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

Run the exercise answers that are code, and check that each still does what its text says.

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

`python -m nbtools reset`: a workshop machine back to its start state between two groups.

It does these things, says each one, and touches nothing else:

1. puts the series' notebooks back as committed (``git checkout`` of the edited ones; a learner's new
   files are listed, never touched);
2. stops the launches nbtools started that are still running (``ps --kill``: only processes that
   carry nbtools' launch mark, never a learner's other jobs or JupyterLab's kernels);
3. lists every process that holds a card (npu-smi's table), and with ``--kill`` stops them;
4. removes the work folders the notebooks made in JupyterLab (``notebooks/work/``, beside the
   notebooks; unattended runs already remove theirs);
5. puts back the Accelerate the requirement files ask for, where 00's exercise replaced it: an
   Accelerate installed from a source checkout or a git URL, or one outside ``requirements.txt``'s
   range, is reinstalled from the package index (or, offline, from ``--find-links WHEELHOUSE``).

``--dry-run`` says what it would do and does nothing.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import nbformat
from packaging.requirements import Requirement

from .checks import SEED_CHECKS, Status, check_ids
from .doctor import REQUIREMENTS, series_requirements
from .errors import ParameterError
from .lang import msg, of_metadata
from .runner import default_notebooks_dir
from .versions import direct_url

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
    n_params = sum("parameters" in cell.get("metadata", {}).get("tags", []) for cell in nb.cells)
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


_FENCE = re.compile(r"^[ \t]*```[\w-]*\n(.*?)^[ \t]*```", re.M | re.S)
_FOLDED = re.compile(r"<details>.*?</details>", re.S)
PROSE_LIMIT = 10_000  # characters of markdown a learner reads, outside the folded hints and answers
# the same reading in English takes about twice the characters (the English edition's twins: 1.8 to 2.0 times)
PROSE_LIMITS = {"zh": PROSE_LIMIT, "en": 2 * PROSE_LIMIT}


def _words(lang: str) -> tuple[str, str, str]:
    """An exercise's heading word (``### 练习 N``; ``### Exercise N`` in English), its hint's and answer's summaries."""
    word, hint, answer = (msg(f"teacher.{k}", lang) for k in ("exercise", "hint", "answer"))
    return word, f"<summary>{hint}</summary>", f"<summary>{answer}</summary>"


def exercise_cells(nb) -> list[tuple[int, int]]:
    """(exercise number, cell index) of every exercise cell: a markdown cell that starts ``### 练习 N``
    (``### Exercise N`` in an English notebook: nbtools.lang)."""
    heading = re.compile(rf"^### {_words(of_metadata(nb.metadata))[0]} (\d+)", re.M)
    return [(int(m.group(1)), i) for i, c in enumerate(nb.cells)
            if c.cell_type == "markdown" and (m := heading.match(c.source))]


def exercise_problems(nb) -> list[str]:
    """Each exercise is its own markdown cell (``### 练习 N``, numbered 1, 2, ... in order) with its folded
    hint and answer, sharing the cell with no section, followed by an empty code cell to work in."""
    found, (word, *summaries) = exercise_cells(nb), _words(of_metadata(nb.metadata))
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
    produced = "\n".join(
        [c.source for p in paths for c in nbformat.read(p, as_version=4).cells if c.cell_type == "code"]
        + [f.read_text(encoding="utf-8") for f in Path(__file__).parent.glob("*.py")]
        + [f.read_text(encoding="utf-8") for f in Path(__file__).parent.glob("messages/*.json")]
    )
    prefixes = {cid.split("-")[0] for cid in check_ids}
    problems = []
    for p in paths:
        for i, cell in enumerate(nbformat.read(p, as_version=4).cells):
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
    summary = _words(lang)[2]
    if summary not in exercise_md:
        raise ParameterError(f"the exercise has no {summary}")
    answer = exercise_md.split(summary, 1)[1].split("</details>", 1)[0]  # not a fence after the fold
    return [textwrap.dedent(m.group(1)).rstrip("\n") + "\n" for m in _FENCE.finditer(answer)]


def _indented(source: str, replaced: str, code: str) -> str:
    """``code`` to put where ``replaced`` starts: a match that starts an indented line gives the code's
    further lines that indentation too (a learner's block pasted into a loop body)."""
    at = source.index(replaced)
    indent = source[source.rfind("\n", 0, at) + 1 : at]
    indent = indent if not indent.strip() else ""
    return textwrap.indent(code.rstrip("\n"), indent).removeprefix(indent)  # the first line goes where the match was


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
            if edit["replace"] not in cell.source:
                raise ParameterError(f"{edit['replace']!r} is not in the cell any more")
            cell.source = cell.source.replace(edit["replace"], _indented(cell.source, edit["replace"], code), 1)
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
        status, reason = verdicts.get(check_id, (Status.MISSING, "the variant has no such check"))
        kind, _, pattern = want.partition(":")
        if status != kind.strip():
            answer.problems.append(f"{check_id}: expected {want!r}, got {status} ({reason[:300]})")
        elif pattern.strip() and not re.search(pattern.strip(), reason):
            answer.problems.append(f"{check_id}: {status}, but its reason does not match {pattern.strip()!r}: {reason[:300]}")


def run_answers(notebooks: list[Path], output_dir: Path, *, kernel: str, timeout: float | None, log=print,
                kind: str | None = None) -> list[Answer]:
    """Run every answer of ``notebooks``; an answer whose spec lists ``devices`` (e.g. ``["npu", "cuda"]``:
    its checks are skipped on a CPU) runs only where the device ``kind`` is one of them."""
    from .runner import judge_checks, run_notebooks

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


WORK = "work"  # the folder the notebooks' interactive work folders live in (session._work_dir)


def accelerate_requirement() -> Requirement:
    """The ``accelerate`` line of requirements.txt (e.g. ``accelerate>=1.0``)."""
    wanted = series_requirements()
    if "accelerate" not in wanted:
        raise ValueError(f"{REQUIREMENTS} has no accelerate line")
    return Requirement(f"accelerate{wanted['accelerate']}")


def accelerate_problem(requirement: Requirement) -> str | None:
    """Why the installed Accelerate is not the one the requirement files give a learner; None when it is."""
    try:
        dist = metadata.distribution("accelerate")
    except metadata.PackageNotFoundError:
        return "Accelerate is not installed"
    if direct := direct_url("accelerate"):  # installed from a folder, a git URL or a file: 00's source install
        return f"Accelerate {dist.version} was installed from {direct.get('url', 'a local source')}"
    if not requirement.specifier.contains(dist.version, prereleases=True):
        return f"Accelerate {dist.version} is outside requirements.txt's {requirement}"
    return None


def reset(notebooks: Path | None = None, *, dry_run: bool = False, kill: bool = False, find_links: str | None = None,
          say=print) -> None:
    """Do (or, with ``dry_run``, list) the steps, saying each. ``kill``: also stop every process that holds a
    card (npu-smi's table), not only nbtools' launches."""
    from .ps import find, render, stop

    verb = "would" if dry_run else "did"
    folder = notebooks or default_notebooks_dir()
    _restore_notebooks(folder, dry_run, say)
    if launches := find():
        say(f"launches still running ({len(launches)}):\n{render(launches)}")
        if not dry_run:
            stop(launches)
        say(f"{verb} stop them (guardian first, then SIGKILL whatever still carries nbtools' mark)")
    else:
        say("no launch of nbtools is running")

    _card_holders(kill, dry_run, say)
    work = folder / WORK
    if work.is_dir():
        folders = sorted(p.name for p in work.iterdir())
        if not dry_run:
            shutil.rmtree(work)
        say(f"{verb} remove {work} ({len(folders)} work folder(s): {', '.join(folders) or 'empty'})")
    else:
        say(f"no work folders ({work} does not exist)")

    requirement = accelerate_requirement()
    if (problem := accelerate_problem(requirement)) is None:
        say(f"Accelerate {metadata.version('accelerate')} is what requirements.txt asks for ({requirement}): left alone")
        return
    cmd = [sys.executable, "-m", "pip", "install", "--force-reinstall", "--no-deps", str(requirement)]
    if find_links:
        cmd[4:4] = ["--no-index", "--find-links", find_links]
    say(f"{problem}: {verb} reinstall it: {' '.join(cmd[1:])}")
    if not dry_run:
        subprocess.run(cmd, check=True)
        say(f"Accelerate is now {metadata.version('accelerate')}")


def _restore_notebooks(folder: Path, dry_run: bool, say) -> None:
    """The series' notebooks back as committed (git): a learner's edits and autosaves undone; new files left alone."""
    def git(*args: str) -> subprocess.CompletedProcess:  # -z: names with spaces or non-ASCII letters as they are
        return subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True)

    if shutil.which("git") is None or (edited := git("ls-files", "-z", "--modified", "--", "*.ipynb")).returncode != 0:
        say(f"{folder} is not a git checkout (or git is missing): the notebooks cannot be put back as committed "
            "(clone the repository again)")
        return
    names = sorted(set(filter(None, edited.stdout.split("\0"))))
    if names and not dry_run:
        git("checkout", "--", *names)
    say(f"{'would' if dry_run else 'did'} restore {len(names)} edited notebook(s) as committed: {', '.join(names)}"
        if names else "the notebooks are as committed")
    new = list(filter(None, git("ls-files", "-z", "--others", "--exclude-standard", "--", "*.ipynb").stdout.split("\0")))
    if new:
        say(f"left alone (not part of the series, a learner's own?): {', '.join(new)}")


def _card_holders(kill: bool, dry_run: bool, say) -> None:
    """Every process holding a card, whoever started it (npu-smi's table); stopped with ``kill`` (unless ``dry_run``)."""
    from .proctree import existing, is_alive, terminate_then_kill
    from .ps import npu_smi_table

    table = npu_smi_table()
    if not isinstance(table, dict):
        say("no npu-smi here: no card holders to list" if table is None else f"npu-smi: {table}")
        return
    pids = sorted({p["pid"] for p in table["processes"] if isinstance(p.get("pid"), int)})
    if not pids:
        say("no process holds a card")
        return
    say(f"processes holding a card: {', '.join(map(str, pids))}"
        + ("" if kill and not dry_run else " (--kill would stop them)" if kill else " (--kill stops them)"))
    if kill and not dry_run:
        killed = terminate_then_kill(existing(pids))
        alive = [p.pid for p in existing(pids) if is_alive(p)]
        say(f"stopped {len(pids) - len(alive)} of {len(pids)}" + (f" ({len(killed)} needed SIGKILL)" if killed else "")
            + (f"; still alive (another user's?): {alive}" if alive else ""))
