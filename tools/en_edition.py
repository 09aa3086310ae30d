"""The English edition's twins: make one from a Chinese notebook, and check that it still matches it.

    python tools/en_edition.py skeleton 02_distributed_eval     # notebooks/en/02_distributed_eval.ipynb, if missing
    python tools/en_edition.py check [NAME ...]                 # every English twin (or those named)

An English notebook ``notebooks/en/NAME.ipynb`` is its Chinese twin ``notebooks/NAME.ipynb`` cell for cell: the same
cell ids, types, order and tags; its code is the Chinese code with only string constants and comments changed (the
ASTs are compared with string constants and comments removed; magic lines and `%%writefile` bodies as code); each
English cell records which version of its Chinese cell it translates in ``metadata.translation.source_sha``
(``twin_hash``), so a Chinese cell changed later is found, naming the cell.
"""
from __future__ import annotations

import ast
import copy
import hashlib
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ZH = ROOT / "notebooks"
EN = ZH / "en"


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


def skeleton(name: str) -> Path:
    """The Chinese notebook copied to notebooks/en/ with every cell's ``source_sha`` set (text still Chinese)."""
    src, dst = ZH / f"{name}.ipynb", EN / f"{name}.ipynb"
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

        def visit_JoinedStr(self, node):
            values = [self.visit(v) for v in node.values if isinstance(v, ast.FormattedValue)]
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


def check(name: str) -> list[str]:
    """What is wrong with notebooks/en/NAME.ipynb against its Chinese twin: one line per cell."""
    zh, en = load(ZH / f"{name}.ipynb"), load(EN / f"{name}.ipynb")
    where = f"notebooks/en/{name}.ipynb"
    zc, ec = zh["cells"], en["cells"]
    if [c.get("id") for c in zc] != [c.get("id") for c in ec]:
        return [f"{where}: the cell ids differ from notebooks/{name}.ipynb's (same cells, same order)"]
    problems = []
    for z, e in zip(zc, ec):
        cid = z.get("id")
        if z["cell_type"] != e["cell_type"] or z["metadata"].get("tags") != e["metadata"].get("tags"):
            problems.append(f"{where} cell {cid}: type or tags differ from the Chinese cell's")
        if e["metadata"].get("translation", {}).get("source_sha") != twin_hash(z):
            problems.append(f"{where} cell {cid}: the Chinese cell changed since this translation: translate it again")
        if z["cell_type"] == "code":
            try:
                same = code_shape("".join(z["source"])) == code_shape("".join(e["source"]))
            except SyntaxError as exc:
                problems.append(f"{where} cell {cid}: does not parse ({exc})")
                continue
            if not same:
                problems.append(f"{where} cell {cid}: its code differs from the Chinese cell's (only strings and "
                                "comments may)")
    return problems


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("skeleton", "check"):
        print(__doc__)
        return 2
    names = [Path(a).stem for a in argv[1:]]
    if argv[0] == "skeleton":
        for n in names:
            print(skeleton(n))
        return 0
    names = names or sorted(p.stem for p in EN.glob("*.ipynb"))
    problems = [p for n in names for p in check(n)]
    print("\n".join(problems) or f"{len(names)} English notebooks match their Chinese twins")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
