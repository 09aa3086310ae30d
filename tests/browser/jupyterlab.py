"""Drive JupyterLab from a headless browser: the server, the page, Run All, Ctrl+S.

Used by tests/test_browser.py. The page is read through JupyterLab's DOM (cells, input
prompts, output areas with their ``data-mime-type``); what the page cannot tell apart (an
error output and plain stderr both render as ``application/vnd.jupyter.stderr``) is read from
the notebook saved with Ctrl+S, read from disk (see ``save_and_read``).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from nbtools.checks import check_ids
from nbtools.guarded import free_port
from nbtools.proctree import is_alive, remember, terminate_then_kill

STDERR_MIME = "application/vnd.jupyter.stderr"

# Seconds. A loaded 2-core machine: JupyterLab's first page ~15 s, 02's launch ~60 s in the lab.
SERVER_START = 300
PAGE_LOAD = 300
KERNEL_START = 300
NOTEBOOK_RUN = 1500
SAVE = 120
POLL = 0.25


def wait_until(predicate, timeout: float, what: str, interval: float = POLL, on_timeout=None):
    """Poll ``predicate`` until it returns something truthy; fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            detail = on_timeout() if on_timeout else ""
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{': ' + detail if detail else ''}")
        time.sleep(interval)


class Lab:
    """A JupyterLab server on a temporary root, with its whole process tree under control."""

    def __init__(self, base: Path):
        self.base = base
        self.root = base / "root"  # what JupyterLab serves: copies only
        self.settings = base / "settings"
        self.log_path = base / "jupyterlab.log"
        self.token = secrets.token_hex(24)
        self.proc: subprocess.Popen | None = None
        self.tree: dict | None = None  # pid -> psutil.Process: the server and every descendant seen
        self.port = 0
        self.env: dict[str, str] = {}  # added to the server's environment (and so its kernels')

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def page_url(self, path: str, reset: bool = False) -> str:
        return f"{self.url}/{path}?{'reset&' if reset else ''}token={self.token}"

    def _write_settings(self) -> None:
        # All cells in the DOM (no windowing), so the page can be read cell by cell; no news, no update check.
        settings = {
            "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
            "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
                "fetchNews": "false",
                "checkForUpdates": False,
            },
        }
        for rel, value in settings.items():
            path = self.settings / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(value), encoding="utf-8")

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._write_settings()
        env = dict(
            os.environ,
            **self.env,
            JUPYTER_CONFIG_DIR=str(self.base / "config"),  # no user config leaks in
            JUPYTER_RUNTIME_DIR=str(self.base / "runtime"),  # kernel connection files stay here
            PYTHONUNBUFFERED="1",
        )
        last_error = ""
        for _ in range(3):  # a random free port can be taken before the server binds it
            self.port = free_port()
            argv = [
                sys.executable, "-m", "jupyterlab",
                "--no-browser", "--allow-root",
                "--ip=127.0.0.1", f"--port={self.port}", "--ServerApp.port_retries=0",
                f"--IdentityProvider.token={self.token}",
                f"--ServerApp.root_dir={self.root}",
                f"--LabApp.user_settings_dir={self.settings}",
                f"--LabApp.workspaces_dir={self.base / 'workspaces'}",
                "--LabApp.news_url=",
                "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                "--LabApp.extension_manager=readonly",
            ]
            log = open(self.log_path, "a", encoding="utf-8")
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                cwd=self.base, start_new_session=True,
            )
            log.close()
            self.tree = {}
            remember(self.proc.pid, self.tree)
            deadline = time.monotonic() + SERVER_START
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    if self.request("GET", "/api/status")[0] == 200:
                        return
                except (urllib.error.URLError, OSError):
                    pass
                time.sleep(0.5)
            last_error = self.log_tail()
            self.stop()
            if "already in use" not in last_error:
                break
        raise AssertionError(f"JupyterLab did not start; its log ends:\n{last_error}")

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, object]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", f"token {self.token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=60) as resp:
            raw = resp.read()
            return resp.status, (json.loads(raw) if raw else None)

    def sessions(self, path: str | None = None) -> list[dict]:
        found = self.request("GET", "/api/sessions")[1] or []
        return [s for s in found if path is None or s.get("path") == path]

    def kernel_state(self, path: str) -> str | None:
        found = self.sessions(path)
        return found[0]["kernel"]["execution_state"] if found else None

    def shutdown_sessions(self, path: str | None = None) -> None:
        for s in self.sessions(path):
            try:
                self.request("DELETE", f"/api/sessions/{s['id']}")
            except urllib.error.HTTPError:
                pass

    def stop(self) -> None:
        """Kernels first (politely), then the server and every descendant still alive."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                self.shutdown_sessions()
            except (urllib.error.URLError, OSError):
                pass
        if self.tree is not None:
            remember(self.proc.pid, self.tree)  # kernels started since; once the server is gone they cannot be found
            terminate_then_kill([p for p in self.tree.values() if is_alive(p)], grace=10.0)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        self.proc = None


# What the page shows: per cell, code or not, its prompt and its output areas.
STATE_JS = """() => {
  const panel = document.querySelector('#jp-main-dock-panel .jp-NotebookPanel:not(.lm-mod-hidden)');
  if (!panel) return null;
  const indicator = panel.querySelector('.jp-Notebook-ExecutionIndicator');
  return {
    indicator: indicator ? indicator.dataset.status : null,
    cells: [...panel.querySelectorAll('.jp-Notebook .jp-Cell')].map(c => ({
      code: c.classList.contains('jp-CodeCell'),
      prompt: ((c.querySelector('.jp-InputPrompt') || {}).textContent || '').trim(),
      outputs: [...c.querySelectorAll('.jp-OutputArea-output')].map(
        o => ({mime: o.dataset.mimeType || '', text: o.textContent || ''})),
    })),
  };
}"""


def prompt_count(prompt: str):
    """'[12]:' -> 12, '[*]:' -> '*', '[ ]:' or '' -> None."""
    m = re.fullmatch(r"\[\s*(\d+|\*)?\s*\]:?", prompt)
    if not m or m.group(1) is None:
        return None
    return "*" if m.group(1) == "*" else int(m.group(1))


def output_text(cell: dict) -> str:
    return "\n".join(o["text"] for o in cell["outputs"])


@dataclass
class Observed:
    """What a Run All showed: the final page state, the saved notebook, the streaming evidence."""

    state: dict
    saved: nbformat.NotebookNode
    streamed: dict | None = None
    seconds: float = 0.0
    screenshots: list[Path] = field(default_factory=list)


def page_state(page) -> dict:
    state = page.evaluate(STATE_JS)
    assert state is not None, "no notebook panel is open in JupyterLab"
    return state


def open_notebook(page, lab: Lab, name: str) -> dict:
    """Open ``name`` on a clean workspace with a fresh kernel; return the page state once it is idle.

    Every other kernel is shut down first: one notebook at a time on a small machine.
    """
    lab.shutdown_sessions()
    page.goto(lab.page_url(f"lab/tree/{quote(name)}", reset=True), timeout=PAGE_LOAD * 1000)
    page.wait_for_selector("#jp-main-dock-panel .jp-NotebookPanel .jp-Notebook .jp-Cell", timeout=PAGE_LOAD * 1000)

    def ready():
        state = page_state(page)
        return state if lab.kernel_state(name) == "idle" and state["indicator"] == "idle" else None

    return wait_until(ready, KERNEL_START, f"the kernel of {name} to be idle", on_timeout=lab.log_tail)


def shot(page, artifacts: Path, name: str, full_page: bool = False) -> Path:
    path = artifacts / name
    page.screenshot(path=str(path), full_page=full_page)
    return path


def click_run_all(page) -> None:
    """Run > Run All Cells, from the menu bar as a learner does."""
    page.locator("#jp-menu-panel .lm-MenuBar-item", has_text=re.compile(r"^\s*Run\s*$")).click()
    page.locator('.lm-Menu-item[data-command="runmenu:run-all"]').click()


def run_all(page, lab: Lab, name: str, artifacts: Path, stream: tuple[int, str] | None = None) -> Observed:
    """Run All from the Run menu; wait for an idle kernel and no queued cell; save with Ctrl+S.

    ``stream``: (cell index, line prefix) -- record the first moment that line is in the cell's
    output area while the cell is still running ('[*]'), and the last moment the cell was still
    seen running after that: their difference is how long before the end the output was shown.
    """
    stem = Path(name).stem
    shots = [shot(page, artifacts, f"{stem}-opened.png")]
    t0 = time.monotonic()
    click_run_all(page)

    def code_prompts(state):
        return [prompt_count(c["prompt"]) for c in state["cells"] if c["code"]]

    wait_until(lambda: any(p is not None for p in code_prompts(page_state(page))), PAGE_LOAD, "Run All to start")
    streamed = None
    calm = 0
    deadline = time.monotonic() + NOTEBOOK_RUN
    state = page_state(page)
    while True:
        state = page_state(page)
        watching = False
        if stream is not None:
            idx, prefix = stream
            cell = state["cells"][idx]
            cell_running = prompt_count(cell["prompt"]) == "*"
            if streamed is None:
                lines = [ln for o in cell["outputs"] for ln in o["text"].splitlines() if ln.startswith(prefix)]
                if cell_running and lines:
                    now = round(time.monotonic() - t0, 2)
                    streamed = {"seen_s": now, "running_until_s": now, "prompt": cell["prompt"], "line": lines[0],
                                "kernel": lab.kernel_state(name)}
                    scroll_to(page, idx)
                    shots.append(shot(page, artifacts, f"{stem}-streaming.png"))
            elif cell_running:
                streamed["running_until_s"] = round(time.monotonic() - t0, 2)
            watching = streamed is None or cell_running
        running = "*" in code_prompts(state)
        # idle between two cells happens; done = idle with nothing queued, 3 polls in a row
        calm = calm + 1 if not running and lab.kernel_state(name) == "idle" and state["indicator"] == "idle" else 0
        if calm >= 3:
            break
        if time.monotonic() > deadline:
            shots.append(shot(page, artifacts, f"{stem}-timeout.png"))
            raise AssertionError(f"{name}: still running after {NOTEBOOK_RUN} s; prompts {code_prompts(state)}")
        time.sleep(POLL if watching else 1.0)
    seconds = time.monotonic() - t0
    shots.append(shot(page, artifacts, f"{stem}-done.png"))
    saved = save_and_read(page, lab, name, state)
    (artifacts / f"{stem}.lab.ipynb").write_text(nbformat.writes(saved), encoding="utf-8")
    return Observed(state, saved, streamed, seconds, shots)


def save_and_read(page, lab: Lab, name: str, state: dict) -> nbformat.NotebookNode:
    """Ctrl+S, then the notebook as the server stored it, once it holds what the page shows.

    The file is read from disk, not through the contents API: a GET that lands while the server
    is writing the file in place finds it unreadable and, seeing the atomic-writing backup, puts
    the backup (the notebook before the save) back over it and keeps the new one as
    ``<name>.invalid`` (jupyter_server's ``_read_notebook``; CI, 2026-12-03: the save was logged,
    and the polling then undid it). Reading the file cannot change it; a half-written file does
    not parse and is read again.
    """
    shown = [prompt_count(c["prompt"]) for c in state["cells"] if c["code"]]
    page.locator("#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current").first.click()
    page.keyboard.press("Control+s")

    def saved():
        try:
            nb = nbformat.read(lab.root / name, as_version=4)
        except ValueError:  # not JSON yet: the server is still writing it
            return None
        counts = [c.get("execution_count") for c in nb.cells if c.cell_type == "code"]
        return nb if counts == shown else None

    def logged():
        saves = lab.log_path.read_text(encoding="utf-8", errors="replace").count(f"Saving file at /{name}")
        return f"the server logged {saves} save(s) of {name}"

    return wait_until(saved, SAVE, f"Ctrl+S to store {name} as the page shows it (execution counts {shown})",
                      interval=0.5, on_timeout=logged)


def saved_errors(nb) -> list[tuple[int, str]]:
    """Every error output of the saved notebook: (cell index, 'Name: value')."""
    found = []
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if out.get("output_type") == "error":
                found.append((i, f"{out.get('ename')}: {str(out.get('evalue', '')).strip()[:400]}"))
    return found


def scroll_to(page, index: int) -> None:
    page.evaluate(
        "(i) => document.querySelectorAll('#jp-main-dock-panel .jp-NotebookPanel:not(.lm-mod-hidden) "
        ".jp-Notebook .jp-Cell')[i].scrollIntoView()",
        index,
    )


def check_cells(nb) -> list[tuple[int, str]]:
    return [(i, cid) for i, c in enumerate(nb.cells) for cid in check_ids(c.get("metadata", {}).get("tags"))]


def streaming_cell(nb) -> tuple[int, str]:
    """The cell whose output must stream, and the first line it must show while still running.

    The first ``%launch`` cell: its ``$ <command as written>`` line (the quick-start's
    ``ASCEND_RT_VISIBLE_DEVICES=... accelerate launch``), printed before any rank starts.
    Without a launch: the last ``%cmd`` / ``%%cmd`` cell and its ``$ `` command line.
    """
    code = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    for i, c in code:
        m = re.search(r"%launch\s+(?:--\S+\s+)*(\S+)", c.source)
        if m:
            return i, "$ " + m.group(1).split("{")[0]
    runs = [i for i, c in code if re.search(r"^(?:\w+\s*=\s*)?%%?cmd\b", c.source, re.MULTILINE)]
    assert runs, "the notebook runs no command: no cell to watch for streaming output"
    return runs[-1], "$ "


def write_notebook(path: Path, sources: list[str]) -> Path:
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [new_markdown_cell(f"# {path.stem} (scratch, written by tests/test_browser.py)")]
    nb.cells += [new_code_cell(src) for src in sources]
    nbformat.write(nb, path)
    return path
