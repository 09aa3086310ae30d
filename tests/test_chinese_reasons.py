"""What a learner reads under a check, and what a notebook prints for them, is Simplified Chinese.

Read from the notebooks' code cells with ast (magics turned into Python by IPython's own transformer): the
reason or detail passed to ``nbtools.passed`` / ``nbtools.skipped`` (a literal, an f-string, or a name assigned
in the notebook such as ``zero_skip`` or ``why``), and what ``print()`` prints in a cell that is not a
``%%writefile`` script. Such a text fails when it holds an English sentence: 4 or more ASCII words in a row,
once quoted spans (a library's message, `code`), identifiers (with _ . / - or digits), ALL-CAPS names
(NPU, DDP, MULTI_CPU) and the f-string's values are taken out. Markdown is out of scope (its prose is Chinese).
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import nbformat
import pytest
from conftest import NOTEBOOKS, ROOT

ENGLISH = re.compile(r"(?<![A-Za-z])[A-Za-z]+(?: [A-Za-z]+){3,}(?![A-Za-z])")
QUOTED = re.compile(r"`[^`]*`|(?<![A-Za-z])'[^'\n]*'(?![A-Za-z])|\"[^\"\n]*\"|“[^”]*”|‘[^’]*’|「[^」]*」")
VALUE = "\0"  # an f-string's {value}: a number or a name, never prose
VERDICTS = {"passed", "skipped"}


def _word_kept(token: str) -> bool:
    core = token.strip("()[]{}<>,;:!?|=+*'\"")
    return not (VALUE in token or re.search(r"[_./\\\-0-9]", core) or (len(core) > 1 and core.isupper()))


def english(text: str) -> str | None:
    """The first English sentence in ``text`` (what a learner would read untranslated), or None."""
    text = QUOTED.sub(" ", text)
    kept = " ".join(t for t in text.split() if _word_kept(t))
    found = ENGLISH.search(kept)
    return found.group(0) if found else None


def _texts(node: ast.AST) -> list[str]:
    """The strings an expression builds: literals whole, f-strings with each {value} as VALUE."""
    parts = {id(v) for s in ast.walk(node) if isinstance(s, ast.JoinedStr) for v in s.values}
    out = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.JoinedStr) and id(sub) not in parts:  # a format spec (:.2f) is part of its value
            out.append("".join(v.value if isinstance(v, ast.Constant) else VALUE for v in sub.values))
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str) and id(sub) not in parts:
            out.append(sub.value)
    return out


def _textual(node: ast.AST) -> bool:
    """Whether a name's value is a text a learner reads (``why = S.only_on_npu(...)``, ``note = "..." if ...``),
    not data that holds strings (a list of matches, a probe)."""
    if isinstance(node, (ast.IfExp, ast.BinOp, ast.BoolOp)):
        return any(_textual(n) for n in ast.iter_child_nodes(node))
    return _is_text(node) or (isinstance(node, ast.Call) and _called(node) == "only_on_npu")


def _is_text(node: ast.AST) -> bool:
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str))


def _python(source: str) -> ast.Module | None:
    """The cell as the kernel runs it (magics as calls); None for a %%writefile script or other cell magic."""
    if source.lstrip().startswith("%%"):
        return None
    from IPython.core.inputtransformer2 import TransformerManager

    return ast.parse(TransformerManager().transform_cell(source))


def _called(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _text_names(trees: list[ast.Module]) -> dict[str, list[ast.AST]]:
    """Every name the cells assign a text to (``zero_skip = (...)``, ``if why := S.only_on_npu(...)``) -> those texts."""
    assigned: dict[str, list[ast.AST]] = {}
    for node in (n for tree in trees for n in ast.walk(tree)):
        if isinstance(node, ast.Assign) and _textual(node.value):
            names = [name for target in node.targets for name in ast.walk(target) if isinstance(name, ast.Name)]
        elif isinstance(node, ast.NamedExpr) and _textual(node.value):
            names = [node.target]
        else:
            continue
        for name in names:
            assigned.setdefault(name.id, []).append(node.value)
    return assigned


def learner_texts(sources: list[str]) -> list[tuple[str, str]]:
    """(where, text) for every reason or detail of a verdict and every printed text of these code cells."""
    trees = [(i, t) for i, s in enumerate(sources) if (t := _python(s)) is not None]
    assigned = _text_names([t for _, t in trees])
    found = []
    for i, tree in trees:
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
            name = _called(call)
            if name in VERDICTS:
                said = call.args[1:2] + [k.value for k in call.keywords if k.arg in ("detail", "reason")]
            else:
                said = list(call.args) if name == "print" else []
            for expr in said:
                values = [expr] + [v for n in ast.walk(expr) if isinstance(n, ast.Name) for v in assigned.get(n.id, [])]
                found += [(f"cell {i} {name}()", t) for v in values for t in _texts(v)]
    return found


def _notebooks() -> list[Path]:
    return sorted(Path(NOTEBOOKS).glob("*.ipynb"))


def _sources(nb) -> list[str]:
    return [c.source for c in nb.cells if c.cell_type == "code"]


@pytest.mark.parametrize("path", _notebooks(), ids=lambda p: p.stem)
def test_reasons_and_printed_sentences_are_chinese(path):
    sources = _sources(nbformat.read(path, as_version=4))
    english_left = [f"code {where}: {english(t)!r} in {t.replace(VALUE, '{…}')!r}" for where, t in learner_texts(sources) if english(t)]
    assert not english_left, f"{path.name}: translate for the learner:\n" + "\n".join(english_left)


@pytest.mark.parametrize(
    "text, flagged",
    [
        ("Accelerate enables FSDP only on an accelerator: on this CPU fsdp2.yaml runs as DDP (shard-trap-cpu)", True),
        ("checked only on NPU: npu-smi is not on this machine, the live table was not read", True),
        (f"bf16 is not supported on this {VALUE}", True),
        (f"all {VALUE} ranks ran a collective over hccl", True),
        ("Accelerate 只在加速卡上启用 FSDP：在这台 CPU 上 fsdp2.yaml 按 DDP 运行（shard-trap-cpu）", False),
        ("只在 NPU 上检查：旧版本报 'Torch not compiled with CUDA enabled'", False),
        ("torch-npu 缺 CANN 时 `import torch` 失败；doctor 点名 torch_npu 与 set_env.sh", False),
        (f"{VALUE} 个 rank，MULTI_CPU/gloo，在 cpu 上", False),
        ("accelerate launch --config_file fsdp2_bf16.yaml train_shard.py --model /path/to/your/model", False),
    ],
)
def test_the_rule(text, flagged):
    """English prose is caught around identifiers and values; Chinese with names, flags and quotes passes."""
    assert bool(english(text)) is flagged, english(text)


def test_the_english_series_would_fail():
    """The rule catches the reasons as they were before the translation (08_sharding at its first commit)."""
    old = subprocess.run(["git", "show", "5975136:notebooks/08_sharding.ipynb"], cwd=ROOT, capture_output=True, text=True)
    if old.returncode:
        pytest.skip("no git history here: " + old.stderr.strip())
    texts = [t for _, t in learner_texts(_sources(nbformat.reads(old.stdout, as_version=4)))]
    assert any(english(t) == "Accelerate enables only on an accelerator" for t in texts), texts


def test_the_reasons_nbtools_gives_are_chinese():
    """S.only_on_npu's reasons (off NPU, and on the simulated one) are Chinese in the Chinese catalogue: they end up in
    the same verdicts (nbtools/messages/zh.json; the English edition's are en.json's, tests/test_en_edition.py)."""
    from nbtools.lang import msg
    from nbtools.session import NEEDS_REAL_NPU

    texts = [msg("session.only_on_npu", "zh", what=""), msg("session.simulated_skip", "zh", needs=NEEDS_REAL_NPU, what="")]
    assert not [t for t in texts if english(t)], texts
    assert all(re.search(r"[\u4e00-\u9fff]", t) for t in [*texts, NEEDS_REAL_NPU]), (texts, NEEDS_REAL_NPU)
