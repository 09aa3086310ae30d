"""JupyterLab for real: headless Chromium drives JupyterLab the way a learner does.

- JupyterLab on 127.0.0.1, a random free port and a token, serving a temporary root that
  holds a COPY of the notebooks (nothing is saved into the repository);
- Debian's Chromium through Playwright's Python package, with the system browser
  (``executable_path``; no browser download, never ``playwright install``);
- 00 and 02: Run All from the Run menu, wait for every execution count and an idle kernel,
  then judge from the page and from the notebook saved with Ctrl+S (an error output and
  plain stderr look the same in the page; the saved file tells them apart);
- the stop button ends every process of a running ``accelerate launch``;
- a fresh clone with only requirements-learner.txt in the kernel (no JupyterLab there) runs 00_ascend_jupyterlab;
- the index.html of a ``python -m nbtools run`` matches its report.json.

The driver (server, page state, Run All, Ctrl+S) is in tests/browser/jupyterlab.py.
Screenshots go to pytest's tmp dir, or to $NBTOOLS_ARTIFACTS/browser when that is set.
Outside CI the module skips when Chromium or Playwright is missing; with CI=true it fails.
Timeouts are generous (a loaded 2-core machine) and every wait is for a state, not a sleep.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import psutil
import pytest
from browser.jupyterlab import (
    NOTEBOOK_RUN,
    PAGE_LOAD,
    STDERR_MIME,
    Lab,
    check_cells,
    click_run_all,
    open_notebook,
    output_text,
    page_state,
    prompt_count,
    run_all,
    saved_errors,
    scroll_to,
    shot,
    streaming_cell,
    wait_until,
    write_notebook,
)
from conftest import NOTEBOOKS, ci_output, processes_mentioning, skip_outside_ci, wait_gone

pytestmark = pytest.mark.notebook

# The line a reader sees beside a verdict (the runner reads the verdict's data; the page shows this text).
VERDICT = re.compile(r"^\[check\] (PASSED|SKIPPED) (\S+)(?: -- (.*))?$", re.MULTILINE)
CHROMIUM = os.environ.get("NBTOOLS_CHROMIUM", "/usr/bin/chromium")
# --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


# --------------------------------------------------------------------------- tools present?


def missing_tools() -> list[str]:
    missing = []
    if importlib.util.find_spec("playwright") is None:
        missing.append("the playwright Python package (pip install playwright; the system Chromium is used, "
                       "never `playwright install`)")
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        missing.append(f"Chromium at {CHROMIUM} (apt-get install chromium, or set NBTOOLS_CHROMIUM)")
    if importlib.util.find_spec("jupyterlab") is None:
        missing.append("jupyterlab (pip install -r requirements.txt)")
    return missing


def require_tools() -> None:
    """Skip without the tools, except in CI, where a skip would hide a missing install."""
    missing = missing_tools()
    if not missing:
        return
    skip_outside_ci("the browser test needs " + "; ".join(missing))


def test_browser_tools_are_installed():
    require_tools()


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    env = os.environ.get("NBTOOLS_ARTIFACTS")
    d = Path(env) / "browser" if env else tmp_path_factory.mktemp("browser-artifacts")
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="module")
def browser():
    require_tools()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True, timeout=120_000)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    pg.set_default_timeout(PAGE_LOAD * 1000)
    try:
        yield pg
    finally:
        context.close()


@pytest.fixture(scope="module")
def lab(tmp_path_factory, artifacts):
    require_tools()
    base = tmp_path_factory.mktemp("lab")
    server = Lab(base)
    server.root.mkdir()
    for nb in sorted(Path(NOTEBOOKS).glob("[0-9][0-9]*_*.ipynb")):
        shutil.copy2(nb, server.root / nb.name)
    try:
        server.start()
        yield server
    finally:
        left = _stop_lab(server, base, artifacts)
        assert not left, f"left running after JupyterLab was stopped: {left}"


def _stop_lab(server: Lab, base: Path, artifacts: Path) -> list[str]:
    """Stop the server and keep its log. Nothing of it may survive: it, its kernels and what they launched all
    mention ``base``; what is left after 30 s is killed, and its command lines returned."""
    server.stop()
    if server.log_path.exists():
        shutil.copy2(server.log_path, artifacts / f"jupyterlab-{base.name}.log")  # one per server
    left = []
    for p in wait_gone(str(base) + os.sep, timeout=30):
        with contextlib.suppress(psutil.Error):  # it may end meanwhile
            left.append(" ".join(p.cmdline()))
            p.kill()
    return left


# --------------------------------------------------------------------------- the series in JupyterLab


@pytest.mark.parametrize("name", ["00_environment.ipynb", "02_distributed_eval.ipynb"])
def test_notebook_runs_clean_in_jupyterlab(lab, page, artifacts, name):
    nb = nbformat.read(lab.root / name, as_version=4)
    stream = streaming_cell(nb)
    open_notebook(page, lab, name)
    try:
        seen = run_all(page, lab, name, artifacts, stream=stream)
    finally:
        lab.shutdown_sessions(name)
    cells = seen.state["cells"]
    assert len(cells) == len(nb.cells), "the page does not show every cell of the notebook"

    # 1. no cell failed: judged from the saved notebook (the page shows errors and stderr alike)
    errors = saved_errors(seen.saved)
    if errors:
        scroll_to(page, errors[0][0])
        seen.screenshots.append(shot(page, artifacts, f"{Path(name).stem}-error.png"))
    assert not errors, f"{name} in JupyterLab: error output(s) {errors}; screenshots: {seen.screenshots}"
    # 2. every code cell ran, in the page and in the saved file (but the empty cells left for the exercises:
    #    JupyterLab does not send an empty cell to the kernel, so it gets no execution count)
    not_run = [i for i, c in enumerate(cells)
               if c["code"] and nb.cells[i].source.strip() and not isinstance(prompt_count(c["prompt"]), int)]
    assert not not_run, f"{name}: cells {not_run} have no execution count in the page"
    assert all(c.execution_count for c in seen.saved.cells if c.cell_type == "code" and c.source.strip())
    # 3. each assertion cell printed its own verdict, read from its OUTPUT area (never the source)
    ids = check_cells(nb)
    assert ids, f"{name} has no check cell"
    for i, cid in ids:
        verdicts = [(s, reason) for s, vid, reason in VERDICT.findall(output_text(cells[i])) if vid == cid]
        assert verdicts, f"{name}: check cell {i} ({cid}) shows no '[check] PASSED {cid}' in its output area"
        status, reason = verdicts[-1]
        assert status == "PASSED" or (status == "SKIPPED" and reason.strip()), (cid, status, reason)
    # 4. the launch streamed: its command line was in the cell while the cell was still running
    idx, prefix = stream
    assert seen.streamed, (
        f"{name}: cell {idx} never showed a line starting with {prefix!r} while it was running "
        f"(output buffered until the end?); its final output starts: {output_text(cells[idx])[:300]!r}"
    )
    assert seen.streamed["prompt"] == "[*]:"
    early = seen.streamed["running_until_s"] - seen.streamed["seen_s"]
    assert early >= 1.0, f"{name}: cell {idx} showed {prefix!r} only {early:.2f} s before it ended: {seen.streamed}"
    print(f"{name}: ran in JupyterLab in {seen.seconds:.0f} s; streamed {seen.streamed}")


def test_a_cell_error_is_told_apart_from_stderr(lab, page, artifacts):
    """The judge itself: stderr is not an error, an exception is, and Run All stops there."""
    name = "zz_error.ipynb"
    write_notebook(lab.root / name, [
        "import sys\nprint('only a warning, not an error', file=sys.stderr)",
        "assert 1 + 1 == 3, 'broken on purpose'",
        "print('never runs')",
    ])
    open_notebook(page, lab, name)
    try:
        seen = run_all(page, lab, name, artifacts)
    finally:
        lab.shutdown_sessions(name)
    cells = seen.state["cells"]
    stderr_like = [i for i, c in enumerate(cells) for o in c["outputs"] if o["mime"] == STDERR_MIME]
    assert stderr_like == [1, 2], f"the page should render stderr and the error alike: {stderr_like}"
    assert saved_errors(seen.saved) == [(2, "AssertionError: broken on purpose")], saved_errors(seen.saved)
    assert prompt_count(cells[3]["prompt"]) is None and seen.saved.cells[3].execution_count is None


# --------------------------------------------------------------------------- a learner's fresh clone


def _link_the_images_torch(image: Path) -> list[str]:
    """Stand in for an NPU image's own torch (README.zh-CN: "两个文件都不装 torch"): torch and what it requires
    (extras followed, so pip finds every requirement met), linked from this environment into `image`, a folder
    OUTSIDE the learner venv that a .pth file puts on its path, as an image's system packages are. pip then sees
    torch installed and keeps it, and never writes there: a symlink inside the venv's own site-packages let pip
    write THROUGH it (a CUDA library under nvidia/ rewritten in place while the other test worker had it mapped:
    SIGBUS in a gather's rank 0)."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    linked, seen, todo = [], set(), [("torch", frozenset())]
    while todo:
        name, extras = todo.pop()
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        key = canonicalize_name(dist.metadata["Name"])
        if (key, extras) in seen or key in {"pip", "setuptools"}:  # the venv has its own
            continue
        seen.add((key, extras))
        todo += [(r.name, frozenset(r.extras)) for r in map(Requirement, dist.requires or [])
                 if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in extras | {""})]
        if key in linked:
            continue
        linked.append(key)
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] not in ("..", "__pycache__")}:
            src, dst = Path(dist.locate_file(top)), image / top
            if src.exists() and not dst.exists():
                dst.symlink_to(src)
    return linked


def _libraries(image: Path) -> dict[str, int]:
    """Each shared library behind the image's links, with its modification time: a library rewritten in place
    kills whatever process has it mapped (SIGBUS)."""
    return {str(path): path.stat().st_mtime_ns for top in image.iterdir() if top.is_dir()
            for path in top.resolve().rglob("*.so*") if path.is_file()}


def _version(python: Path, name: str) -> str:
    return subprocess.run([str(python), "-c", f"from importlib import metadata; print(metadata.version({name!r}))"],
                          capture_output=True, text=True, check=True).stdout.strip()


def test_a_fresh_clone_with_the_learner_requirements_runs_00_in_jupyterlab(browser, artifacts, tmp_path):
    """README.zh-CN's path, as a learner takes it: clone, install requirements-learner.txt and nbtools into the
    kernel's Python (which already has the image's torch) with tools/install.py, open 00_ascend_jupyterlab in JupyterLab, Run All.
    The clone is of the committed HEAD: uncommitted changes are not in it. The kernel has no JupyterLab and no
    nbconvert (the platform brings its own JupyterLab), and every cell runs without an error."""
    repo = Path(NOTEBOOKS).resolve().parent
    server = Lab(tmp_path)
    subprocess.run(["git", "clone", "-q", str(repo), str(server.root)], check=True, timeout=300)
    venv = tmp_path / "learner"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    image = tmp_path / "image-site-packages"
    image.mkdir()
    assert "torch" in _link_the_images_torch(image)
    (site / "the-images-packages.pth").write_text(f"{image}\n")
    before = _libraries(image)
    torch_before = _version(python, "torch")
    # README.zh-CN's 方式 A with the kernel's interpreter: tools/install.py holds the image's torch at its version
    install = subprocess.run([str(python), "tools/install.py", "-q"], cwd=server.root, capture_output=True, text=True,
                             timeout=1200)
    if install.returncode != 0:
        skip_outside_ci(f"pip could not install requirements-learner.txt (no package index?): {install.stderr[-600:]}")
    changed = sorted(path for path, stamp in _libraries(image).items() if before.get(path) != stamp)
    assert not changed, f"pip wrote into the image's packages (this environment's, in use): {changed[:5]}"
    assert _version(python, "torch") == torch_before, "the install replaced the image's torch"
    missing = subprocess.run([str(python), "-c", "import importlib.util as u; "
                              "print([m for m in ('jupyterlab', 'nbconvert', 'torch', 'nbtools') if u.find_spec(m) is None])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert missing == "['jupyterlab', 'nbconvert']", f"the learner's kernel lacks {missing}"
    # its Python is the notebooks' kernel, python3: the image's default kernel in README.zh-CN's 方式 A
    subprocess.run([str(python), "-m", "ipykernel", "install", "--prefix", str(tmp_path / "jupyter"), "--name", "python3"],
                   check=True, capture_output=True, timeout=120)
    server.env["JUPYTER_PATH"] = str(tmp_path / "jupyter" / "share" / "jupyter")
    name = "notebooks/00_ascend_jupyterlab.ipynb"
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(PAGE_LOAD * 1000)
    try:
        server.start()
        open_notebook(page, server, name)
        seen = run_all(page, server, name, artifacts)
    finally:
        context.close()
        left = _stop_lab(server, tmp_path, artifacts)
    assert not left, f"left running after JupyterLab was stopped: {left}"
    assert not saved_errors(seen.saved), f"a fresh clone's 00 in JupyterLab: {saved_errors(seen.saved)}"
    assert all(c.execution_count for c in seen.saved.cells if c.cell_type == "code" and c.source.strip())
    outputs = "".join(o.get("text", "") for c in seen.saved.cells for o in c.get("outputs", []))
    assert f"这个内核运行的是： {python}" in outputs, "the notebook did not run in the learner's kernel"


SLEEPER = """\
import os
import time

print(f"sleeper rank {os.environ.get('RANK', '?')} started", flush=True)
time.sleep(1200)
"""


def test_stop_button_ends_every_process_of_a_launch(lab, page, artifacts):
    tag = secrets.token_hex(6)
    script = lab.root / f"sleeper_{tag}.py"
    script.write_text(SLEEPER, encoding="utf-8")
    name = f"zz_stop_{tag}.ipynb"
    write_notebook(lab.root / name, [
        f"import nbtools\n\nnbtools.accelerate_launch({str(script)!r}, num_processes=2, timeout=1200)",
    ])
    try:
        open_notebook(page, lab, name)
        click_run_all(page)

        def both_ranks_running():
            cell = page_state(page)["cells"][1]
            text = output_text(cell)
            started = all(f"sleeper rank {r} started" in text for r in (0, 1))
            procs = processes_mentioning(str(script))
            return procs if started and prompt_count(cell["prompt"]) == "*" and len(procs) >= 3 else None

        procs = wait_until(
            both_ranks_running, NOTEBOOK_RUN, "both ranks to print their first line into the running cell",
            on_timeout=lambda: output_text(page_state(page)["cells"][1])[-600:],
        )
        pids = sorted(p.pid for p in procs)  # the launcher and its 2 workers (each in its own session)
        shot(page, artifacts, "stop-running.png")

        page.locator('#jp-main-dock-panel .jp-NotebookPanel:not(.lm-mod-hidden) '
                     '.jp-NotebookPanel-toolbar [data-command="notebook:interrupt-kernel"]').click()

        def stopped():
            cell = page_state(page)["cells"][1]
            done = isinstance(prompt_count(cell["prompt"]), int) and lab.kernel_state(name) == "idle"
            return cell if done else None

        cell = wait_until(stopped, 180, "the interrupted cell to finish")
        shot(page, artifacts, "stop-interrupted.png")
        text = output_text(cell)
        assert "[nbtools] interrupted: stopped" in text and "none is left running" in text, text[-1500:]
        assert "KeyboardInterrupt" in text, text[-1500:]
        left = wait_gone(str(script), timeout=30)
        assert not left, f"still running after the stop button: {[(p.pid, p.cmdline()) for p in left]} (had {pids})"
    finally:
        lab.shutdown_sessions(name)
        for p in processes_mentioning(str(script)):  # only after a failure above
            try:
                p.kill()
            except psutil.Error:
                pass


# --------------------------------------------------------------------------- the run's index.html


def read_tables(page) -> dict:
    return page.evaluate("""() => ({
      ok: document.querySelector('#result').dataset.ok,
      kind: document.querySelector('#device').dataset.kind,
      notebooks: [...document.querySelectorAll('#notebooks tr[data-notebook]')].map(r => ({
        path: r.dataset.notebook, status: r.dataset.status,
        cells: [...r.querySelectorAll('td')].map(td => td.textContent.trim()),
        colour: getComputedStyle(r.querySelector('.status')).backgroundColor})),
      checks: [...document.querySelectorAll('#checks tr[data-check]')].map(r => ({
        id: r.dataset.check, status: r.dataset.status,
        cells: [...r.querySelectorAll('td')].map(td => td.textContent.trim()),
        colour: getComputedStyle(r.querySelector('.status')).backgroundColor})),
    })""")


def test_report_index_matches_report_json(browser, artifacts, tmp_path):
    """The whole series' index (README's ci:series, which CI runs before the tests: every notebook, passed and skipped
    checks); without that run's report, a run of 00 of its own."""
    require_tools()
    out = ci_output("series")
    if out is None:
        out = tmp_path / "run"
        notebook = os.path.join(NOTEBOOKS, "00_environment.ipynb")  # nbtools run writes only into --output
        proc = subprocess.run([sys.executable, "-m", "nbtools", "run", notebook, "--output", str(out)],
                              capture_output=True, text=True, timeout=NOTEBOOK_RUN, cwd=tmp_path)
        assert str(out / "index.html") in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]  # listed with the rest
    index = out / "index.html"
    assert index.is_file()
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))

    context = browser.new_context(viewport={"width": 1200, "height": 900})
    requests: list[str] = []
    context.on("request", lambda r: requests.append(r.url))
    page = context.new_page()
    try:
        page.goto(index.as_uri())
        tables = read_tables(page)
        assert tables["ok"] == str(report["summary"]["ok"]).lower()
        assert tables["kind"] == report["device"]["kind"]
        assert [(n["path"], n["status"]) for n in tables["notebooks"]] == [
            (n["path"], n["status"]) for n in report["notebooks"]
        ]
        for row, n in zip(tables["notebooks"], report["notebooks"]):
            assert row["cells"][1:4] == [n["status"], f"{n['duration_s']:.1f}", n["error"]], (row, n)
        assert [(c["id"], c["status"]) for c in tables["checks"]] == [
            (c["id"], c["status"]) for c in report["checks"]
        ]
        for row, c in zip(tables["checks"], report["checks"]):
            assert row["cells"][0].split()[0] == c["id"], (row, c)
            assert row["cells"][1:] == [c["status"], c["notebook"], c["reason"]], (row, c)
        colours = {(r["status"], r["colour"]) for r in tables["checks"] + tables["notebooks"]}
        by_status = {}
        for status, colour in colours:
            by_status.setdefault(status, set()).add(colour)
        assert all(len(v) == 1 for v in by_status.values()), by_status  # one colour per status ...
        assert len({next(iter(v)) for v in by_status.values()}) == len(by_status), by_status  # ... each its own
        shot(page, artifacts, "report.png", full_page=True)

        # the executed notebook, rendered, one click away; a check links to its own cell
        page.locator('#notebooks tr[data-notebook="00_environment.ipynb"] a', has_text="HTML").click()
        page.wait_for_load_state()
        assert page.url.endswith("/00_environment.html")
        assert "[check] PASSED check-py" in "\n".join(page.locator(".jp-OutputArea-output").all_inner_texts())
        shot(page, artifacts, "report-notebook.png")
        page.go_back()
        page.locator('#checks tr[data-check="check-py"] a').click()
        page.wait_for_load_state()
        anchor = page.url.split("#", 1)[1]
        assert anchor.startswith("cell-id=") and page.locator(f'[id="{anchor}"]').count() == 1
    finally:
        context.close()
    remote = [u for u in requests if not u.startswith(("file:", "data:", "about:"))]
    assert not remote, f"the report fetched from the network: {remote}"
