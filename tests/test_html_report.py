"""index.html and the notebook pages, from a RunReport built here (no notebook is executed)."""

from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from xml.etree import ElementTree as ET

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from nbtools import report as report_module
from nbtools.checks import VERDICT_MIME, CheckResult
from nbtools.report import write_all
from nbtools.run_results import NotebookResult, RunReport

CPU = {
    "kind": "cpu",
    "count": 0,
    "names": [],
    "versions": {"python": "3.11.7", "torch": "2.13.0+cpu", "torch_npu": None, "accelerate": "1.15.0"},
    "visible_var": None,
    "visible_devices": None,
    "problems": [],
    "bf16": True,
    "backend": "gloo",
}
NPU = dict(
    CPU,
    kind="npu",
    count=2,
    names=["Ascend910B3", "Ascend910B3"],
    backend="hccl",
    visible_var="ASCEND_RT_VISIBLE_DEVICES",
    visible_devices="0,1",
    problems=[{"what": "CANN not loaded", "fix": "source set_env.sh", "blocking": True}],
)


class Rows(HTMLParser):
    """What a test reads back from index.html, unescaped: each table row's attributes and its cells' text, the
    links, and each dt, dd and p as (tag, attributes, text)."""

    TEXT = {"td", "dt", "dd", "p"}

    def __init__(self):
        super().__init__()
        self.rows: list[tuple[dict, list[str]]] = []
        self.links: list[str] = []
        self.texts: list[tuple[str, dict, str]] = []
        self._open: tuple[str, dict, list[str]] | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "tr":
            self.rows.append((a, []))
        elif tag in self.TEXT:
            self._open = (tag, a, [])
        elif tag == "a":
            self.links.append(a.get("href", ""))

    def handle_endtag(self, tag):
        if self._open and tag == self._open[0]:
            text = "".join(self._open[2]).strip()
            if tag == "td":
                self.rows[-1][1].append(text)
            else:
                self.texts.append((tag, self._open[1], text))
            self._open = None

    def handle_data(self, data):
        if self._open:
            self._open[2].append(data)

    def checks(self) -> dict[str, tuple[dict, list[str]]]:
        return {a["data-check"]: (a, cells) for a, cells in self.rows if "data-check" in a}

    def notebooks(self) -> dict[str, tuple[dict, list[str]]]:
        return {a["data-notebook"]: (a, cells) for a, cells in self.rows if "data-notebook" in a}

    def meta(self) -> list[tuple[str, str]]:
        """(dt, dd) of the run's description list: ("device", "CPU only ..."), ("kernel", "python3"), ..."""
        return list(zip(*([t for tag, _, t in self.texts if tag == name] for name in ("dt", "dd"))))

    def notes(self) -> list[str]:
        return [t for tag, a, t in self.texts if tag == "p" and a.get("class") == "note"]


def parse(text: str) -> Rows:
    p = Rows()
    p.feed(text)
    return p


def executed_notebook(path: Path) -> nbformat.NotebookNode:
    """An executed notebook as papermill leaves it: a passed check, a failed one, stderr."""
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        new_markdown_cell("# 环境检查\n\n$E = mc^2$"),
        new_code_cell("print('Python')", execution_count=1, outputs=[
            new_output("stream", name="stdout", text="$ python --version\nPython 3.11.7\n"),
            new_output("stream", name="stderr", text="a warning on stderr\n"),
        ]),
        new_code_cell("nbtools.passed('check-py')", execution_count=2, metadata={"tags": ["check:check-py"]},
                      outputs=[new_output("display_data", data={  # as passed() displays it in a kernel
                          VERDICT_MIME: {"check": "check-py", "status": "passed", "reason": "Python 3.11.7"},
                          "text/plain": "[check] PASSED check-py -- Python 3.11.7"})]),
        new_code_cell("assert 1 == 2", execution_count=3, metadata={"tags": ["check:acc-env"]},
                      outputs=[new_output("error", ename="AssertionError", evalue="1 != 2",
                                          traceback=["AssertionError"])]),
    ]
    nbformat.write(nb, path)
    return nb


def make_report(out: Path, device=CPU) -> RunReport:
    executed_notebook(out / "00_environment.ipynb")
    return RunReport(
        device=device,
        notebooks=[
            NotebookResult("00_environment.ipynb", "failed", 12.345, "AssertionError: 1 != 2 (cell In[3])",
                           "00_environment.ipynb"),
            NotebookResult("01_training.ipynb", "not-run", 0.0, "not run: the setup is broken"),
        ],
        checks=[
            CheckResult("check-py", "passed", "00_environment.ipynb", "Python 3.11.7", True),
            CheckResult("acc-install-source", "skipped", "00_environment.ipynb", "needs the network", True),
            CheckResult("acc-env", "failed", "00_environment.ipynb", "AssertionError: 1 != 2", True),
            CheckResult("acc-dispatch", "missing", "", "no notebook cell is tagged check:acc-dispatch", True),
            CheckResult("extra-thing", "passed", "00_environment.ipynb", "<b>not bold</b> & co", False),
        ],
        parameters={"num_processes": 2},
        started="2026-01-01T00:00:00+0000",
        duration_s=20.5,
    )


NETWORK = re.compile(
    r"<script[^>]*\bsrc=|<link\b[^>]*\bhref=[\"']?(https?:)?//|url\(\s*[\"']?(https?:)?//|@import", re.IGNORECASE
)


def test_write_all_writes_index_with_every_notebook_and_check(tmp_path):
    report = make_report(tmp_path)
    paths = write_all(report, tmp_path)
    index = tmp_path / "index.html"
    assert index in paths and index.is_file()
    page = parse(index.read_text(encoding="utf-8"))

    nbs = page.notebooks()
    assert list(nbs) == [n.path for n in report.notebooks]
    for n in report.notebooks:
        attrs, cells = nbs[n.path]
        assert attrs["data-status"] == n.status and f"st-{n.status}" in attrs["class"]
        assert cells[0] == n.path and cells[1] == n.status
        assert cells[2] == f"{n.duration_s:.1f}" and cells[3] == n.error

    checks = page.checks()
    assert list(checks) == [c.id for c in report.checks]
    for c in report.checks:
        attrs, cells = checks[c.id]
        assert attrs["data-status"] == c.status and f"st-{c.status}" in attrs["class"], attrs
        assert attrs["data-seed"] == str(c.seed).lower()
        assert cells[0].split()[0] == c.id and cells[1] == c.status
        assert cells[2] == c.notebook and cells[3] == c.reason  # reasons of skips and failures shown as is


def css_rules(page: str) -> dict[str, dict[str, str]]:
    """selector -> {property: value} of the <style> blocks of a written page."""
    rules: dict[str, dict[str, str]] = {}
    for block in re.findall(r"<style[^>]*>(.*?)</style>", page, re.S):
        for selectors, body in re.findall(r"([^{}]+)\{([^}]*)\}", block):
            decls = dict(
                (k.strip(), v.strip()) for k, v in (d.split(":", 1) for d in body.split(";") if ":" in d)
            )
            for sel in selectors.split(","):
                rules.setdefault(" ".join(sel.split()), {}).update(decls)
    return rules


def test_index_is_self_contained_and_coloured(tmp_path):
    report = make_report(tmp_path)
    write_all(report, tmp_path)
    text = (tmp_path / "index.html").read_text(encoding="utf-8")  # the page a reader opens
    assert not NETWORK.search(text), NETWORK.search(text)
    assert "<script" not in text.lower()
    assert '<div class="banner bad" id="result" data-ok="false">FAILED' in text
    # every status in the page gets a colour of its own; the bad ones share red
    rules = css_rules(text)
    page = parse(text)
    shown = {a["data-status"] for a, _ in page.rows if "data-status" in a}
    assert shown == {"passed", "skipped", "failed", "missing", "not-run"}  # the report above has each
    colour = {}
    for status in shown:
        assert any(f"st-{status}" in a.get("class", "") for a, _ in page.rows if a.get("data-status") == status)
        colour[status] = rules.get(f".st-{status} .status", {}).get("background")
        assert colour[status] and colour[status].startswith("#"), (status, rules)
    assert colour["failed"] == colour["missing"] == colour["not-run"]
    assert len({colour["passed"], colour["skipped"], colour["failed"]}) == 3
    assert "<b>not bold</b>" not in text and "&lt;b&gt;not bold&lt;/b&gt; &amp; co" in text
    assert "CPU only (no NPU/CUDA visible); backend gloo" in text and "torch 2.13.0+cpu" in text and "torch_npu" not in text


def test_banner_passes_when_everything_passed(tmp_path):
    report = make_report(tmp_path)
    report.notebooks = report.notebooks[:1]
    report.notebooks[0].status, report.notebooks[0].error = "passed", ""
    report.checks = [c for c in report.checks if c.status in ("passed", "skipped")]
    assert report.ok
    text = report_module.render_index(report)
    assert '<div class="banner ok" id="result" data-ok="true">' in text
    assert "PASSED: 1/1 notebooks passed; checks: 2 passed, 1 skipped" in text


def test_npu_device_and_its_problem_are_named(tmp_path):
    text = report_module.render_index(make_report(tmp_path, NPU))
    assert "NPU x2 (Ascend910B3); backend hccl" in text
    assert 'data-kind="npu" data-count="2"' in text
    assert "ASCEND_RT_VISIBLE_DEVICES=0,1" in text
    assert "CANN not loaded (fix: source set_env.sh)" in text


def test_notebook_pages_beside_the_executed_notebooks_without_network_assets(tmp_path):
    report = make_report(tmp_path)
    report_module.write_html(report, tmp_path)
    page_path = tmp_path / "00_environment.html"
    assert page_path.is_file()
    page = page_path.read_text(encoding="utf-8")
    # nbconvert's lab template would pull require.js / MathJax / mermaid from cdnjs
    assert "cdnjs" not in page and "<script" not in page.lower(), "a remote script is still in the page"
    assert not NETWORK.search(page), NETWORK.search(page)
    assert "[check] PASSED check-py" in page and "AssertionError" in page and "环境检查" in page
    assert "jp-Notebook" in page and "<style" in page  # the lab look, inlined

    nb = nbformat.read(tmp_path / "00_environment.ipynb", as_version=4)
    cell_id = nb.cells[2].id
    assert f'id="cell-id={cell_id}"' in page
    links = parse((tmp_path / "index.html").read_text(encoding="utf-8")).links
    # a check links to its own assertion cell in the page; the notebook to its page and its .ipynb
    assert f"00_environment.html#cell-id={cell_id}" in links
    assert "00_environment.html" in links and "00_environment.ipynb" in links
    # a notebook that never ran has no page and no link
    assert not any(link.startswith("01_training") for link in links)


def test_without_nbconvert_the_index_links_the_ipynb_and_says_why(tmp_path, monkeypatch):
    def broken():
        raise ImportError("No module named 'nbconvert'")

    monkeypatch.setattr(report_module, "offline_exporter", broken)
    report = make_report(tmp_path)
    paths = report_module.write_html(report, tmp_path)
    assert paths == [tmp_path / "index.html"]
    assert not (tmp_path / "00_environment.html").exists()
    page = parse((tmp_path / "index.html").read_text(encoding="utf-8"))
    assert page.notes() == ["notebook pages not rendered (ImportError: No module named 'nbconvert'); pip install nbconvert"]
    links = page.links
    assert "00_environment.ipynb" in links and not any(".html" in link for link in links)


def test_junit_is_valid_xml_with_terminal_escapes_and_control_characters(tmp_path):
    """Outputs and errors carry ANSI colours, NUL, bell, form feed, backspace: junit.xml stays XML 1.0
    that a parser reads, the text stays readable, and its counts are report.json's."""
    import json

    report = make_report(tmp_path)
    dirty = "\x1b[0;31mAssertionError\x1b[0m: got\x00 \x07bell\x0c\x08 \x1b]0;title\x07中文 ok"
    report.notebooks[0].error = dirty
    report.checks[2].reason = dirty
    report.checks[1].reason = "skipped \x1b[33mbecause\x1b[0m \x01"
    write_all(report, tmp_path)
    raw = (tmp_path / "junit.xml").read_bytes()
    suite = ET.fromstring(raw)  # raises on an invalid document
    failures = [f.get("message") for f in suite.iter("failure")]
    assert "AssertionError: got bell 中文 ok" in failures
    assert "failed: AssertionError: got bell 中文 ok" in failures
    assert [s.get("message") for s in suite.iter("skipped")] == ["skipped because "]
    summary = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))["summary"]
    assert {k: int(suite.get(k)) for k in ("tests", "failures", "skipped")} == summary["junit"]
    cases = list(suite.iter("testcase"))
    assert len(cases) == summary["junit"]["tests"] == len(report.notebooks) + len(report.checks)
    assert summary["junit"]["failures"] == sum(c.find("failure") is not None for c in cases) == 4
    assert summary["junit"]["skipped"] == sum(c.find("skipped") is not None for c in cases) == 1
    md = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "\x1b" not in md and "\x00" not in md and "AssertionError: got bell 中文 ok" in md


def test_stopped_run_says_so(tmp_path):
    report = make_report(tmp_path)
    report.stopped_by = "SIGTERM"
    text = report_module.render_index(report)
    assert '<div class="banner bad" id="result" data-ok="false">STOPPED by SIGTERM:' in text


def test_kernel_log_is_linked(tmp_path):
    report = make_report(tmp_path)
    report.notebooks[0].kernel_log = "00_environment.kernel.log"
    (tmp_path / "00_environment.kernel.log").write_text("[IPKernelApp] a kernel line\n")
    write_all(report, tmp_path)
    assert "00_environment.kernel.log" in parse((tmp_path / "index.html").read_text(encoding="utf-8")).links
    assert "[00_environment.kernel.log](00_environment.kernel.log)" in (tmp_path / "report.md").read_text(encoding="utf-8")


def test_both_reports_show_the_parameters_as_one_shell_line(tmp_path):
    """index.html and report.md quote the -p options alike, so that bash gives the values back as they were."""
    if not shutil.which("bash"):
        pytest.skip("no bash")
    report = make_report(tmp_path)
    report.parameters = {"num_processes": 2, "home": "~", "msg": "a b|c", "quote": "it's"}
    write_all(report, tmp_path)
    shown = dict(parse((tmp_path / "index.html").read_text(encoding="utf-8")).meta())["parameters"]
    md = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert f"- parameters: `{shown}`\n" in md
    words = subprocess.run(["bash", "-c", "printf '%s\\n' " + shown], capture_output=True, text=True).stdout
    assert words.splitlines() == ["-p", "num_processes=2", "-p", "home=~", "-p", "msg=a b|c", "-p", "quote=it's"]


def test_html_escapes_what_it_shows_and_markdown_does_not(tmp_path):
    report = make_report(tmp_path)
    report.checks[4].id = 'x"><script>alert(1)</script>'
    report.notebooks[1].path = '01 <&> "q".ipynb'
    report.checks[1].reason = "a | b\nc"
    write_all(report, tmp_path)
    text = (tmp_path / "index.html").read_text(encoding="utf-8")
    assert "<script" not in text
    page = parse(text)
    assert report.checks[4].id in page.checks() and report.notebooks[1].path in page.notebooks()
    assert page.checks()["acc-install-source"][1][3] == "a | b\nc"
    md = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert f"| {report.checks[4].id} (extra) | passed |" in md and "| <b>not bold</b> & co |" in md
    assert f"| {report.notebooks[1].path} | not-run |" in md
    assert "| acc-install-source | skipped | 00_environment.ipynb | a \\| b c |" in md  # one row still


def test_a_missing_value_shows_as_nothing(tmp_path):
    report = make_report(tmp_path, dict(CPU, count=None, backend=None))
    write_all(report, tmp_path)
    assert 'data-count=""' in (tmp_path / "index.html").read_text(encoding="utf-8")
    for name in ("index.html", "report.md"):
        assert "None" not in (tmp_path / name).read_text(encoding="utf-8"), name


@pytest.mark.parametrize("device", [NPU, dict(NPU, simulated=True, simnpu={"SIMNPU_CARDS": "2"})])
def test_the_cli_line_and_every_junit_testcase_say_simulated_when_it_was(tmp_path, device):
    """A green line or a green testcase read on its own (a CI dashboard) must not pass for a real card."""
    report = make_report(tmp_path, device)
    simulated = bool(device.get("simulated"))
    assert ("on the simulated NPU" in report_module.summary_line(report)) is simulated
    report_module.write_junit(report, tmp_path / "junit.xml")
    cases = ET.parse(tmp_path / "junit.xml").getroot().findall("testcase")
    assert cases and all(c.get("classname").startswith("simulated_npu.") is simulated for c in cases)


def test_the_verdict_table_in_the_log_holds_every_check_failed_ones_last_the_device_versions_and_report_path(tmp_path):
    """What Ascend's guard keeps of a run is its log: the table must say what failed and why without report.json."""
    report = make_report(tmp_path, device={**CPU, "versions": {"python": "3.12.1", "torch": "2.9.0", "torch_npu": None}})
    report.checks[2].reason = "AssertionError: 1 != 2\nfix: the second line"
    lines = report_module.verdict_table(report, tmp_path).splitlines()
    assert lines[0].split() == ["status", "check", "notebook:", "reason"]
    rows = [ln.split()[:2] for ln in lines[1:8]]
    assert rows == [["passed", "check-py"], ["skipped", "acc-install-source"], ["passed", "extra-thing"],
                    ["failed", "acc-env"], ["missing", "acc-dispatch"], ["failed", "(notebook)"], ["not-run", "(notebook)"]]
    assert "00_environment.ipynb: AssertionError: 1 != 2 / fix: the second line" in lines[4]
    assert lines[5].endswith("-: no notebook cell is tagged check:acc-dispatch")
    assert lines[6].endswith("00_environment.ipynb: AssertionError: 1 != 2 (cell In[3])")
    assert lines[8] == f"device: {report_module.device_line(report.device)}" and lines[9] == "versions: python 3.12.1, torch 2.9.0"
    assert lines[10].startswith(f"report.json: {(tmp_path / 'report.json').resolve()} ")
