"""The English edition (issue 60): twins checked against their Chinese notebooks, a Chinese edit found on exactly its
twin and carried over by `sync`, the learner's language chosen by the notebook (under `nbtools run`, plain papermill
and JupyterLab 4's kernel environment), one catalogue per language, and an English run's outputs free of Chinese."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import shutil
import string
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from conftest import NOTEBOOKS, ROOT, required_ci_output
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from nbtools import lang

_spec = importlib.util.spec_from_file_location("en_edition", Path(ROOT, "tools", "en_edition.py"))
ed = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ed)

NAME = "02_distributed_eval"
ENGLISH = sorted(p.stem for p in Path(NOTEBOOKS, "en").glob("*.ipynb"))


@pytest.mark.parametrize("name", ENGLISH or [pytest.param("", marks=pytest.mark.skip(reason="no notebooks/en/ yet"))])
def test_every_english_notebook_is_its_chinese_twin(name):
    """Same cells, ids, types, tags; source_sha of the Chinese cell's current version; code AST-equal modulo strings
    and comments (`python tools/en_edition.py check`)."""
    assert not ed.check(name), "\n".join(ed.check(name))


def test_english_notebooks_are_committed_clean():
    """`nbtools check`'s rules per notebook (clean, tagged, exercises as `### Exercise N` with Hint and Answer), and
    every label or message their prose quotes is one their code or nbtools (its English catalogue too) produces."""
    from nbtools.lint import check_notebook, quote_problems

    paths = [Path(NOTEBOOKS, "en", f"{n}.ipynb") for n in ENGLISH]
    problems = [p for path in paths for p in check_notebook(path)[0]]
    ids = {cid for path in paths for cid in check_notebook(path)[1]}
    assert not problems + quote_problems(paths, ids), "\n".join(problems + quote_problems(paths, ids))
    chinese = [f"{path.name} cell {c['id']}" for path in paths for c in ed.load(path)["cells"]
               if re.search(r"[\u4e00-\u9fff]", json.dumps(c["metadata"].get("nbtools", {}), ensure_ascii=False))]
    assert not chinese, f"answers expecting Chinese reasons (nbtools speaks English there): {chinese}"


def test_the_english_run_ends_as_the_chinese_one():
    """ci:series-en-simulated-npu: each check of its notebooks ends as in ci:series-simulated-npu's Chinese run on the
    same host, and its outputs and reasons hold no Chinese outside quoted program output."""
    if not ENGLISH:
        pytest.skip("no notebooks/en/ yet")
    runs = [required_ci_output(name, command) for name, command in (("series-en-simulated-npu", "series-en-simulated-npu"),
                                                                     ("simulated-npu", "series-simulated-npu"))]
    en, zh = (json.loads((r / "report.json").read_text(encoding="utf-8")) for r in runs)
    ran = {Path(n["path"]).name for n in en["notebooks"]}
    statuses = [{c["id"]: c["status"] for c in report["checks"] if c["notebook"] in ran} for report in (en, zh)]
    assert statuses[0] and statuses[0] == statuses[1]
    assert not ed.scan(runs[0]), "\n".join(ed.scan(runs[0]))


def _cell(nb: dict, cid: str) -> dict:
    return next(c for c in nb["cells"] if c["id"] == cid)


@pytest.fixture
def repo(tmp_path):
    """A git repository holding 02 and its English twin, one code cell and one markdown cell translated."""
    (tmp_path / "notebooks").mkdir()
    shutil.copy(Path(NOTEBOOKS, f"{NAME}.ipynb"), tmp_path / "notebooks")
    ed.skeleton(NAME, tmp_path)
    zp, ep = ed._paths(NAME, tmp_path)
    en = ed.load(ep)
    check = _cell(en, "nb02-10")
    check["source"] = ed._src(check).replace("，在 {E.on} 上收集到 {num_processes} x [1, 2, 3]", ", gathered {num_processes} x [1, 2, 3] on {E.on}")
    check["source"] = check["source"].replace("# The quick-start's expected block", "# The expected block, translated")
    _cell(en, "nb02-05")["source"] = "## Writing the cross-card test script `gather_npu.py`\n"
    ed.save(ep, en)
    assert "x [1, 2, 3] on {E.on}" in ed._src(_cell(ed.load(ep), "nb02-10")) and not ed.check(NAME, tmp_path)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "twins"], check=True)
    return tmp_path


def _edit_chinese(root: Path, code_line: str) -> None:
    zp, _ = ed._paths(NAME, root)
    zh = ed.load(zp)
    _cell(zh, "nb02-05")["source"] = ed._src(_cell(zh, "nb02-05")) + "\n再多说一句。\n"
    check = _cell(zh, "nb02-10")
    check["source"] = ed._src(check).replace("from nbtools.ranks import assert_block\n",
                                             "from nbtools.ranks import assert_block\n" + code_line + "\n")
    ed.save(zp, zh)


def test_a_chinese_edit_fails_exactly_its_twins_and_sync_fixes_the_code(repo):
    """Break it once: one markdown and one code cell changed in Chinese -> check names exactly their twins; sync
    gives the code twin the new code with its English strings and comments kept, and lists the markdown."""
    _edit_chinese(repo, "limit = 3")
    problems = ed.check(NAME, repo)
    assert {p.split(" cell ")[1].split(":")[0] for p in problems} == {"nb02-05", "nb02-10"}, problems
    resynced, todo = ed.sync(NAME, repo)
    assert [r.split(" cell ")[1] for r in resynced] == ["nb02-10"] and len(todo) == 1 and "nb02-05" in todo[0], (resynced, todo)
    code = ed._src(_cell(ed.load(ed._paths(NAME, repo)[1]), "nb02-10"))
    assert "limit = 3" in code and "x [1, 2, 3] on {E.on}" in code and "translated" in code, code
    assert [p.split(" cell ")[1].split(":")[0] for p in ed.check(NAME, repo)] == ["nb02-05"]
    assert ed.sync(NAME, repo) == ([], todo)  # idempotent
    _, ep = ed._paths(NAME, repo)
    en = ed.load(ep)
    _cell(en, "nb02-05")["source"] = "## Writing the cross-card test script `gather_npu.py`\n\nOne more sentence.\n"
    ed.save(ep, en)
    assert ed.translated(NAME, ["nb02-05"], repo) == [] and ed.check(NAME, repo) == []


def test_a_chinese_string_brought_in_is_listed_and_keeps_failing(repo):
    """A code edit that brings Chinese text: the code is synced, the hash is not, the twin is listed for a translator."""
    _edit_chinese(repo, 'print("新的一行")')
    _, todo = ed.sync(NAME, repo)
    assert any("nb02-10" in t and "新的一行" in t for t in todo), todo
    assert any("nb02-10" in p for p in ed.check(NAME, repo))
    _, ep = ed._paths(NAME, repo)
    en = ed.load(ep)
    _cell(en, "nb02-10")["source"] = ed._src(_cell(en, "nb02-10")).replace("新的一行", "one more line")
    ed.save(ep, en)
    assert ed.translated(NAME, ["nb02-10"], repo) == [] and not any("nb02-10" in p for p in ed.check(NAME, repo))


def test_cells_added_removed_and_code_that_differs(repo):
    """A Chinese cell added or removed is followed by sync; English code that differs beyond strings and comments
    fails, and `translated` refuses it."""
    zp, ep = ed._paths(NAME, repo)
    zh = ed.load(zp)
    zh["cells"].insert(3, {"cell_type": "code", "id": "new-1", "metadata": {}, "source": "y = 2", "outputs": [],
                           "execution_count": None})
    zh["cells"] = [c for c in zh["cells"] if c["id"] != "f4c553d2"]
    ed.save(zp, zh)
    assert "cell ids differ" in ed.check(NAME, repo)[0]
    resynced, todo = ed.sync(NAME, repo)
    assert any("f4c553d2: removed" in r for r in resynced) and any("new-1" in t for t in todo), (resynced, todo)
    assert ed.translated(NAME, ["new-1"], repo) == [] and ed.check(NAME, repo) == []
    en = ed.load(ep)
    _cell(en, "nb02-10")["source"] = ed._src(_cell(en, "nb02-10")).replace("world=", "world==", 1).replace(
        "assert_block(", "assert_block(\n    ", 1) + "\nz = 1\n"
    ed.save(ep, en)
    assert any("nb02-10: its code differs" in p for p in ed.check(NAME, repo))
    assert ed.translated(NAME, ["nb02-10"], repo)


@pytest.mark.parametrize("zh, en, same", [
    ('print("你好")  # 注释', 'print("hello")  # comment', True),
    ('x = f"{n} 个进程"', 'x = f"{n} processes"', True),
    ('x = f"{n} 个进程"', 'x = f"{m} processes"', False),
    ('x = f"{n} 个进程在 {d} 上"', 'x = f"on {d}: {n} processes"', True),
    ("x = 1", "x = 2", False),
    ("%cmd python -c 'print(1)'", "%cmd python -c 'print(2)'", False),
    ('%%writefile a.py\nprint("甲")  # 乙\n', '%%writefile a.py\nprint("a")  # b\n', True),
    ("%%writefile a.py\nx = 1\n", "%%writefile a.py\nx = 2\n", False),
    ("%%writefile a.yaml\nkey: 1  # 注释\n", "%%writefile a.yaml\nkey: 1  # comment\n", True),
    ("%%writefile a.yaml\nkey: 1\n", "%%writefile a.yaml\nkey: 2\n", False),
])
def test_code_shape_ignores_only_strings_and_comments(zh, en, same):
    assert (ed.code_shape(zh) == ed.code_shape(en)) is same


def test_an_english_notebooks_unrun_seed_checks_are_not_missing(tmp_path):
    """Running notebooks/en/02 alone: the quick-start's other checks are "not selected" (found in en/, or in the
    Chinese twins' folder while en/ lacks them), in English; never "missing", which fails a run."""
    from nbtools.checks import SEED_CHECKS
    from nbtools.run_results import RunReport
    from nbtools.runner import _add_unclaimed

    for name in ("00_environment", "01_training", "02_distributed_eval", "03_big_model_inference"):
        shutil.copy(Path(NOTEBOOKS, f"{name}.ipynb"), tmp_path)
    (tmp_path / "en").mkdir()
    nb = ed.load(tmp_path / "02_distributed_eval.ipynb")
    nb["metadata"]["nbtools_translation"] = {"lang": "en"}
    ed.save(tmp_path / "en" / "02_distributed_eval.ipynb", nb)
    report = RunReport(device={})
    path = tmp_path / "en" / "02_distributed_eval.ipynb"
    _add_unclaimed(report, {path: nbformat.read(path, as_version=4)})
    got = {c.id: (c.status.value, c.reason) for c in report.checks}
    assert set(got) == set(SEED_CHECKS) and got["check-py"] == ("skipped", "not selected: 00_environment.ipynb was not "
                                                                           "run this time"), got


def test_the_readme_lists_both_editions():
    """README's notebook table links an English twin for exactly the notebooks that have one; README.zh-CN.md points
    to the English edition."""
    readme = Path(ROOT, "README.md").read_text(encoding="utf-8")
    linked = re.findall(r"^\| \[`(\w+)`\]\(notebooks/\1\.ipynb\) \(\[English\]\(notebooks/en/\1\.ipynb\)\)", readme, re.M)
    assert sorted(linked) == ENGLISH
    assert "notebooks/en/" in Path(ROOT, "README.zh-CN.md").read_text(encoding="utf-8")


# --- the learner's language


def test_the_language_is_the_notebooks(tmp_path, monkeypatch):
    """Metadata first, then the folder's name, never the locale; NBTOOLS_LANG overrides."""
    monkeypatch.delenv("NBTOOLS_LANG", raising=False)
    monkeypatch.setenv("LANG", "en_US.UTF-8")
    (tmp_path / "en").mkdir()
    nb = new_notebook(metadata={"nbtools_translation": {"lang": "en"}})
    nbformat.write(nb, tmp_path / "a.ipynb")
    nbformat.write(new_notebook(), tmp_path / "en" / "b.ipynb")
    nbformat.write(new_notebook(), tmp_path / "c.ipynb")
    assert [lang.of_notebook(str(tmp_path / p)) for p in ("a.ipynb", "en/b.ipynb", "c.ipynb", "en/gone.ipynb")] \
        == ["en", "zh", "zh", "en"]
    monkeypatch.setenv("JPY_SESSION_NAME", str(tmp_path / "a.ipynb"))
    assert lang.current() == "en" and lang.msg("lint.exercise") == "Exercise"
    monkeypatch.setenv("NBTOOLS_LANG", "zh")
    assert lang.current() == "zh"


def _english_notebook(folder: Path) -> Path:
    """A small English notebook: the setup cell, a %cmd with a why line, a skip off NPU, a pass, a failing check."""
    nb = new_notebook(metadata={"nbtools_translation": {"lang": "en", "source": "notebooks/x.ipynb"},
                                "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    nb.cells = [
        new_code_cell('device = "auto"\nnum_processes = 2\nwork_dir = ""\ntimeout_s = 300', metadata={"tags": ["parameters"]}),
        new_code_cell("import nbtools\n%load_ext nbtools\nS = nbtools.setup(device=device, num_processes=num_processes, "
                      "timeout_s=timeout_s, work_dir=work_dir)\nimport nbtools.lang\nprint('lang', nbtools.lang.current())"),
        new_code_cell("r = %cmd python -c 'print(40 + 2)'"),
        new_code_cell('if (why := S.only_on_npu("the card answers")):\n    nbtools.skipped("x-skip", why)\nelse:\n'
                      '    nbtools.passed("x-skip", "on NPU")', metadata={"tags": ["check:x-skip", "needs:real-npu"]}),
        new_code_cell('print("not a verdict")', metadata={"tags": ["check:x-none"]}),
        new_markdown_cell("### Exercise 1\n\nDo it.\n\n<details><summary>Hint</summary>h</details>\n"
                          "<details><summary>Answer</summary>\n\n```python\nprint(1)\n```\n</details>"),
        new_code_cell(""),
        new_code_cell("S.close()"),
    ]
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, folder / "01_x.ipynb")
    return folder / "01_x.ipynb"


def test_an_english_run_says_everything_in_english(tmp_path):
    """`nbtools run` on an English notebook: the kernel learns the language from JPY_SESSION_NAME (not its folder:
    this one is not named en), the setup lines, why lines, skip and failure reasons are English: no Chinese in its
    outputs or its report (`scan`), and the exercise is found in English by `nbtools check`."""
    path = _english_notebook(tmp_path / "lesson")
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": ROOT}
    env.pop("NBTOOLS_LANG", None)
    proc = subprocess.run([sys.executable, "-m", "nbtools", "run", str(path), "--output", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    reasons = {c["id"]: c["reason"] for c in report["checks"]}
    assert reasons["x-none"].startswith("the check cell printed no verdict line"), (reasons, proc.stdout[-2000:])
    assert reasons["x-skip"].startswith("checked only on NPU"), reasons
    executed = nbformat.read(out / path.name, as_version=4)
    printed = "".join(o.get("text", "") for c in executed.cells for o in c.get("outputs", []))
    assert "lang en" in printed and "Platform:" in printed, printed
    assert ed.scan(out) == [], ed.scan(out)
    assert not [p for p in __import__("nbtools.lint").lint.exercise_problems(executed)]
    zh = json.loads((out / path.name).read_text(encoding="utf-8"))
    zh["metadata"].pop("nbtools_translation")  # the same outputs read as a Chinese notebook's are not scanned
    (out / path.name).write_text(json.dumps(zh), encoding="utf-8")
    assert ed.scan(out) == []


def test_scan_finds_chinese_outside_quotes(tmp_path):
    nb = new_notebook(metadata={"nbtools_translation": {"lang": "en"}})
    cell = new_code_cell("x")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="quoted '你好' is program output\n平台：CPU\n")]
    nb.cells = [cell]
    nbformat.write(nb, tmp_path / "a.ipynb")
    assert [f.split(": ", 1)[1] for f in ed.scan(tmp_path)] == ["平台：CPU"]


def test_the_kernel_learns_the_language_as_jupyterlab_starts_it(tmp_path):
    """JupyterLab 4's server starts a notebook's kernel with JPY_SESSION_NAME = the notebook's path
    (SessionManager.get_kernel_env) and ipykernel shows it as __session__; plain papermill sets nothing, and the
    kernel's folder (the notebook's) decides."""
    from jupyter_client.manager import start_new_kernel
    from jupyter_server.services.sessions.sessionmanager import SessionManager

    path = _english_notebook(tmp_path / "lesson")
    kernel_env = SessionManager.get_kernel_env(SessionManager(), str(path))
    folder = tmp_path / "en"
    folder.mkdir()
    code = "import nbtools.lang\nprint(nbtools.lang.current(), globals().get('__session__'))"
    plain = {k: v for k, v in os.environ.items() if k not in ("NBTOOLS_LANG", "JPY_SESSION_NAME")} | {"PYTHONPATH": ROOT}
    said = []
    for env, cwd in ((plain | {"JPY_SESSION_NAME": kernel_env["JPY_SESSION_NAME"]}, tmp_path), (plain, folder),
                     (plain, tmp_path)):
        km, kc = start_new_kernel(kernel_name="python3", cwd=str(cwd), env=env)
        try:
            out = []
            kc.execute_interactive(code, output_hook=lambda m, out=out: out.append(m["content"].get("text", "")),
                                   timeout=60)
            said.append("".join(out).strip())
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
    assert said == [f"en {path}", "en None", "zh None"], said


# --- the catalogues


def _placeholders(text: str) -> set[str]:
    return {f for _, f, _, _ in string.Formatter().parse(text) if f is not None}


def test_one_catalogue_per_language_with_the_same_messages():
    zh, en = lang.catalogue("zh"), lang.catalogue("en")
    assert zh.keys() == en.keys()
    assert not [k for k in zh if _placeholders(zh[k]) != _placeholders(en[k])]
    assert not [k for k, v in en.items() if ed.CJK.search(v)], "Chinese left in the English catalogue"
    for key, text in zh.items():  # each formats with its values, whatever they are named (msg's own are positional)
        assert all(lang.msg(key, code, **dict.fromkeys(_placeholders(text), "V")) for code in ("zh", "en"))


def _msg_keys() -> set[str]:
    keys = set()
    for p in Path(ROOT, "nbtools").glob("*.py"):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "msg":
                arg = node.args[0] if node.args else None
                if isinstance(arg, ast.Constant):
                    keys.add(arg.value)
                elif isinstance(arg, ast.JoinedStr):  # msg(f"lint.{k}"): its prefix
                    keys.add(arg.values[0].value + "*")
    return keys


def test_every_message_nbtools_shows_comes_from_the_catalogue():
    """Every msg() key exists, every catalogue entry is used, and no Chinese is left in nbtools' code (docstrings and
    comments aside): a learner's message written in a module would not follow the notebook's language."""
    keys, cat = _msg_keys(), lang.catalogue("zh")
    exact, prefixes = {k for k in keys if not k.endswith("*")}, [k[:-1] for k in keys if k.endswith("*")]
    assert not exact - cat.keys(), f"unknown keys: {exact - cat.keys()}"
    code = "".join(p.read_text("utf-8") for p in Path(ROOT, "nbtools").glob("*.py"))
    unused = [k for k in cat if k not in exact and f'"{k}"' not in code and not any(k.startswith(p) for p in prefixes)]
    assert not unused, f"unused entries: {unused}"
    left = []
    for p in sorted(Path(ROOT, "nbtools").glob("*.py")):
        tree = ast.parse(p.read_text(encoding="utf-8"))
        docs = {id(n.body[0].value) for n in ast.walk(tree) if isinstance(getattr(n, "body", None), list) and n.body
                and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        left += [f"{p.name}:{n.lineno} {n.value[:60]!r}" for n in ast.walk(tree) if isinstance(n, ast.Constant)
                 and isinstance(n.value, str) and id(n) not in docs and re.search(r"[\u4e00-\u9fff]", n.value)]
    assert not left, "move to nbtools/messages/*.json:\n" + "\n".join(left)
