"""The English edition's twins: make one from a Chinese notebook, keep it current, check it, scan its run.

    python tools/en_edition.py skeleton NAME ...         # notebooks/en/NAME.ipynb from notebooks/NAME.ipynb, if missing
    python tools/en_edition.py check [NAME ...]          # every English twin (or those named) against its Chinese one
    python tools/en_edition.py sync [NAME ...]           # after a Chinese edit: the code carried over, the prose listed
    python tools/en_edition.py translated NAME [ID ...]  # a translator's "these cells (all listed) are current again"
    python tools/en_edition.py scan OUTPUT_DIR           # an English run's outputs: Chinese outside quotes is a defect

An English notebook ``notebooks/en/NAME.ipynb`` is its Chinese twin ``notebooks/NAME.ipynb`` cell for cell: the same
cell ids, types, order and tags; its code is the Chinese code with only string constants and comments changed (the
ASTs are compared with string constants and comments removed, an f-string's values in any order; magic lines and
`%%writefile` bodies as code); each
English cell records which version of its Chinese cell it translates in ``metadata.translation.source_sha``
(``twin_hash``), so a Chinese cell changed later is found, naming the cell. Its notebook metadata
``nbtools_translation = {"lang": "en", "source": "notebooks/NAME.ipynb"}`` makes nbtools speak English to it.

``sync`` rebuilds each English notebook on its Chinese one: cells added, removed or moved follow the Chinese order;
a changed Chinese code cell's twin gets the new code, each line the Chinese edit left alone keeps its English
strings and comments (the translated version is found in git by its ``source_sha``), and only where no line brought
Chinese text back is the hash brought up to date; markdown and the cells left with Chinese are listed for a
translator, whose ``translated`` then records them as current. A cell whose text is Chinese on purpose (a data set)
is recorded as current with ``translated`` alone.
"""
from __future__ import annotations

import ast
import copy
import difflib
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CJK = re.compile(r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]")  # CJK ideographs and full-width punctuation


def twin_hash(cell: dict) -> str:
    """Which version of a Chinese cell a translation is of: its type, source and metadata (not ``translation``)."""
    meta = {k: v for k, v in cell.get("metadata", {}).items() if k != "translation"}
    text = json.dumps([cell["cell_type"], "".join(cell["source"]), meta], ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def save(path: Path, nb: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(nb, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


def _paths(name: str, root: Path) -> tuple[Path, Path]:
    return root / "notebooks" / f"{name}.ipynb", root / "notebooks" / "en" / f"{name}.ipynb"


def _src(cell: dict) -> str:
    return "".join(cell["source"])


def skeleton(name: str, root: Path = ROOT) -> Path:
    """The Chinese notebook copied to notebooks/en/ with every cell's ``source_sha`` set (text still Chinese)."""
    src, dst = _paths(name, root)
    if dst.exists():
        return dst
    nb = copy.deepcopy(load(src))
    for cell in nb["cells"]:
        cell["metadata"]["translation"] = {"source_sha": twin_hash(cell)}
    nb["metadata"]["nbtools_translation"] = {"lang": "en", "source": f"notebooks/{name}.ipynb"}
    save(dst, nb)
    return dst


_COMMENT = re.compile(r"(^|\s)#.*$")


def _plain(text: str) -> str:
    """Shell, YAML or other text with its comments and blank lines removed."""
    return "\n".join(line for line in (_COMMENT.sub("", raw).rstrip() for raw in text.splitlines()) if line.strip())


def _python_shape(code: str) -> str:
    """The AST of Python code with every string constant (and f-string text) replaced by one placeholder."""

    class Blank(ast.NodeTransformer):
        def visit_Constant(self, node):
            return ast.copy_location(ast.Constant("S"), node) if isinstance(node.value, str) else node

        def visit_JoinedStr(self, node):  # its values in any order: an English sentence may name them in another
            values = sorted((self.visit(v) for v in node.values if isinstance(v, ast.FormattedValue)), key=ast.dump)
            return ast.copy_location(ast.JoinedStr(values=values), node)

        def visit_Call(self, node):  # IPython's magics: the magic and its line are code, a body is by its kind
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr in ("run_line_magic", "run_cell_magic", "system", "getoutput"):
                args = [a.value if isinstance(a, ast.Constant) else ast.dump(self.visit(a)) for a in node.args]
                if f.attr == "run_cell_magic" and len(args) == 3:
                    args[2] = _body_shape(args[0], args[1], args[2])
                return ast.copy_location(ast.Constant(repr(args)), node)
            return self.generic_visit(node)

    return ast.dump(Blank().visit(ast.parse(code)))


def _body_shape(magic: str, line: str, body: str) -> str:
    if magic == "writefile" and line.split()[-1:] and line.split()[-1].endswith(".py"):
        return _python_shape(body)
    return _plain(body)


def code_shape(source: str) -> str:
    """A code cell as IPython runs it, with string constants and comments removed."""
    from IPython.core.inputtransformer2 import TransformerManager

    return _python_shape(TransformerManager().transform_cell(source))


def _same_code(zh: str, en: str) -> bool | str:
    """True when the two cells' code is the same modulo strings and comments; a SyntaxError's text when one fails."""
    try:
        return code_shape(zh) == code_shape(en)
    except SyntaxError as exc:
        return f"does not parse ({exc})"


def check(name: str, root: Path = ROOT) -> list[str]:
    """What is wrong with notebooks/en/NAME.ipynb against its Chinese twin: one line per cell."""
    (zp, ep), where = _paths(name, root), f"notebooks/en/{name}.ipynb"
    zc, ec = load(zp)["cells"], load(ep)["cells"]
    if [c.get("id") for c in zc] != [c.get("id") for c in ec]:
        return [f"{where}: the cell ids differ from notebooks/{name}.ipynb's (same cells, same order): run sync"]
    problems = []
    for z, e in zip(zc, ec):
        cid = z.get("id")
        if z["cell_type"] != e["cell_type"] or z["metadata"].get("tags") != e["metadata"].get("tags"):
            problems.append(f"{where} cell {cid}: type or tags differ from the Chinese cell's")
        if e["metadata"].get("translation", {}).get("source_sha") != twin_hash(z):
            problems.append(f"{where} cell {cid}: the Chinese cell changed since this translation: translate it again")
        if z["cell_type"] == "code" and (same := _same_code(_src(z), _src(e))) is not True:
            problems.append(f"{where} cell {cid}: " + (same or "its code differs from the Chinese cell's (only strings "
                                                                "and comments may)"))
    return problems


# --- sync: the Chinese edit carried over, each untouched line keeping its English strings and comments


def _translated_version(name: str, cell_id: str, sha: str, root: Path) -> dict | None:
    """The Chinese cell as it was when its twin was translated: the version in git whose twin_hash is ``sha``."""
    rel = f"notebooks/{name}.ipynb"
    log = subprocess.run(["git", "log", "--format=%H", "-n", "200", "--", rel], cwd=root, capture_output=True, text=True)
    for commit in log.stdout.split():
        shown = subprocess.run(["git", "show", f"{commit}:{rel}"], cwd=root, capture_output=True, text=True)
        try:
            cells = json.loads(shown.stdout)["cells"] if shown.returncode == 0 else []
        except ValueError:
            continue
        if found := [c for c in cells if c.get("id") == cell_id and twin_hash(c) == sha]:
            return found[0]
    return None


_STRING = re.compile(r"'''.*?'''|\"\"\".*?\"\"\"|'(?:\\.|[^'\\\n])*'|\"(?:\\.|[^\"\\\n])*\"")


def _line_key(line: str) -> str:
    """A line with its strings blanked and its comment removed: what a translation leaves unchanged."""
    return re.sub(r"#.*$", "", _STRING.sub("S", line)).rstrip()


def _english_lines(old_zh: list[str], en: list[str]) -> dict[int, list[str]]:
    """Old Chinese line i -> the English lines that stand for it (its twin, after the English-only lines before it)."""
    out: dict[int, list[str]] = {}
    pending: list[str] = []
    matcher = difflib.SequenceMatcher(None, [_line_key(x) for x in old_zh], [_line_key(x) for x in en], autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal" or (tag == "replace" and i2 - i1 == j2 - j1):
            for k in range(i2 - i1):
                out[i1 + k], pending = [*pending, en[j1 + k]], []
        elif tag == "insert":
            pending += en[j1:j2]
    return out


def carry_over(old_zh: str, new_zh: str, en: str) -> tuple[str, list[str]]:
    """The new Chinese code with the English strings and comments of every line the Chinese edit left alone, and
    the lines that came from the Chinese edit holding Chinese text (for a translator)."""
    old, new, eng = old_zh.splitlines(), new_zh.splitlines(), en.splitlines()
    english = _english_lines(old, eng)
    out, chinese = [], []
    for tag, i1, _, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        for k in range(j2 - j1):
            if tag == "equal" and i1 + k in english:
                out += english[i1 + k]
            else:
                out.append(new[j1 + k])
                chinese += [new[j1 + k]] if CJK.search(new[j1 + k]) else []
    text = "\n".join(out) + ("\n" if new_zh.endswith("\n") else "")
    if _same_code(new_zh, text) is not True:  # the lines did not line up: the Chinese code whole, for a translator
        return new_zh, [line for line in new if CJK.search(line)] or ["(the code could not be lined up)"]
    return text, chinese


def _synced_cell(name: str, z: dict, e: dict | None, root: Path) -> tuple[dict, str]:
    """The English cell for Chinese cell ``z`` (its twin ``e``, None for a new cell) and what a translator must do."""
    sha = twin_hash(z)
    if e is not None and e["metadata"].get("translation", {}).get("source_sha") == sha:
        return e, ""
    cell = copy.deepcopy(e if e is not None and e["cell_type"] == z["cell_type"] else z)
    old_sha = (e or {}).get("metadata", {}).get("translation", {}).get("source_sha", "")
    cell["metadata"] = {**copy.deepcopy(z["metadata"]), "translation": {"source_sha": old_sha}}
    if e is not None and "nbtools" in e["metadata"]:  # an exercise's answers expect English reasons: the translator's
        cell["metadata"]["nbtools"] = e["metadata"]["nbtools"]
    if z["cell_type"] != "code":
        return cell, "new cell: translate it" if e is None else "the Chinese text changed: translate it again"
    old = _translated_version(name, z.get("id"), old_sha, root) if e is not None else None
    code, chinese = carry_over(_src(old), _src(z), _src(e)) if old is not None else (_src(z), ["(no earlier version)"])
    cell["source"], cell["outputs"], cell["execution_count"] = code.splitlines(keepends=True), [], None
    if e is not None and not [line for line in chinese if CJK.search(line)]:
        cell["metadata"]["translation"]["source_sha"] = sha
        return cell, ""
    return cell, "code re-synced; translate its Chinese strings/comments: " + " | ".join(s.strip() for s in chinese)[:300]


def sync(name: str, root: Path = ROOT) -> tuple[list[str], list[str]]:
    """notebooks/en/NAME.ipynb rebuilt on its Chinese twin: (cells whose code was re-synced, cells for a translator)."""
    zp, ep = _paths(name, root)
    zh, en = load(zp), load(ep)
    twins = {c.get("id"): c for c in en["cells"]}
    cells, resynced, todo = [], [], []
    for z in zh["cells"]:
        e = twins.get(z.get("id"))
        cell, need = _synced_cell(name, z, e, root)
        cells.append(cell)
        where = f"notebooks/en/{name}.ipynb cell {z.get('id')}"
        if z["cell_type"] == "code" and e is not None and cell["source"] != e["source"]:
            resynced.append(where)
        if need:
            todo.append(f"{where}: {need}")
    dropped = [cid for cid in twins if cid not in {z.get("id") for z in zh["cells"]}]
    resynced += [f"notebooks/en/{name}.ipynb cell {cid}: removed (gone from the Chinese notebook)" for cid in dropped]
    if cells != en["cells"]:
        en["cells"] = cells
        save(ep, en)
    return resynced, todo


def translated(name: str, ids: list[str], root: Path = ROOT) -> list[str]:
    """Record the named cells (default: every cell) of notebooks/en/NAME.ipynb as translating their Chinese cells'
    current version; a code cell whose code differs from its twin's is refused."""
    zp, ep = _paths(name, root)
    zh, en = {c.get("id"): c for c in load(zp)["cells"]}, load(ep)
    refused = []
    for e in en["cells"]:
        z = zh.get(e.get("id"))
        if z is None or (ids and e.get("id") not in ids):
            continue
        if z["cell_type"] == "code" and _same_code(_src(z), _src(e)) is not True:
            refused.append(f"notebooks/en/{name}.ipynb cell {e.get('id')}: its code differs from the Chinese cell's")
            continue
        e["metadata"].setdefault("translation", {})["source_sha"] = twin_hash(z)
    save(ep, en)
    return refused


# --- scan: an English run's outputs hold no Chinese outside quoted program output

_QUOTED = re.compile(r"'[^'\n]*'|\"[^\"\n]*\"|`[^`\n]*`|“[^”\n]*”|「[^」\n]*」")


def _output_texts(output: dict) -> list[str]:
    if output.get("output_type") == "stream":
        return ["".join(output.get("text", ""))]
    if output.get("output_type") == "error":
        return [output.get("evalue", "")]
    data = output.get("data", {})
    return ["".join(v) if isinstance(v, list) else json.dumps(v, ensure_ascii=False)
            for k, v in data.items() if k.startswith("text/") or k.endswith("json")]


def scan(folder: Path) -> list[str]:
    """Every line of an English executed notebook's outputs (and its report's reasons) holding Chinese outside quotes."""
    found = []
    for path in sorted(folder.glob("*.ipynb")):
        nb = load(path)
        if nb["metadata"].get("nbtools_translation", {}).get("lang") != "en":
            continue
        for i, cell in enumerate(nb["cells"]):
            for text in (t for o in cell.get("outputs", []) for t in _output_texts(o)):
                found += [f"{path.name} cell {i} ({cell.get('id')}): {line.strip()[:200]}"
                          for line in text.splitlines() if CJK.search(_QUOTED.sub("", line))]
    report = folder / "report.json"
    if report.exists():
        names = {p.name for p in folder.glob("*.ipynb") if load(p)["metadata"].get("nbtools_translation")}
        found += [f"report.json {c['id']}: {c['reason'][:200]}" for c in json.loads(report.read_text("utf-8"))["checks"]
                  if c.get("notebook") in names and CJK.search(_QUOTED.sub("", c.get("reason", "")))]
    return found


def main(argv: list[str]) -> int:
    commands = ("skeleton", "check", "sync", "translated", "scan")
    if not argv or argv[0] not in commands:
        print(__doc__)
        return 2
    cmd, args = argv[0], argv[1:]
    if cmd == "scan":
        found = [f for a in args for f in scan(Path(a))]
        print("\n".join(found) or f"no Chinese outside quotes in the English outputs of {', '.join(args)}")
        return 1 if found or not args else 0
    if cmd == "translated":
        refused = translated(Path(args[0]).stem, args[1:])
        print("\n".join(refused) or f"notebooks/en/{Path(args[0]).stem}.ipynb: recorded as current")
        return 1 if refused else 0
    names = [Path(a).stem for a in args] or sorted(p.stem for p in (ROOT / "notebooks" / "en").glob("*.ipynb"))
    if cmd == "skeleton":
        print("\n".join(str(skeleton(n)) for n in names))
        return 0
    if cmd == "sync":
        done = [sync(n) for n in names]
        resynced, todo = [x for d in done for x in d[0]], [x for d in done for x in d[1]]
        print("\n".join(["code re-synced:", *resynced] if resynced else ["no code to re-sync"]))
        print("\n".join(["for a translator (then: python tools/en_edition.py translated NAME ID ...):", *todo]
                        if todo else ["nothing for a translator"]))
        return 0
    problems = [p for n in names for p in check(n)]
    print("\n".join(problems) or f"{len(names)} English notebooks match their Chinese twins")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
