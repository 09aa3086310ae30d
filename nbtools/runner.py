"""Execute the notebooks with papermill, as JupyterLab would, and judge every check.

- working directory = the notebook's folder (JupyterLab's behaviour, not papermill's);
- parameters injected only into notebooks that declare them;
- each notebook gets a private work dir under one run-level temp dir, removed at the end;
- a notebook that finished with cells that never ran (``sys.exit``) is failed;
- when the setup is broken (e.g. torch_npu without CANN), the first failure stops the
  run and the remaining notebooks are reported as not run, with the cause.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from .checks import SEED_CHECKS, VERDICT, check_ids
from .device import CACHE_ENV, DeviceInfo, detect
from .errors import ParameterError

DEFAULT_KERNEL = "python3"
# NN_slug.ipynb, and NNx_slug.ipynb for a part that follows NN (01b_... after 01_...).
SERIES_GLOB = "[0-9][0-9]*_*.ipynb"


@dataclass
class NotebookResult:
    path: str
    status: str  # passed / failed / not-run
    duration_s: float = 0.0
    error: str = ""
    output: str = ""  # executed notebook, relative to the output dir


@dataclass
class CheckResult:
    id: str
    status: str  # passed / failed / skipped / missing
    notebook: str = ""
    reason: str = ""
    seed: bool = False


@dataclass
class RunReport:
    device: dict
    notebooks: list[NotebookResult] = field(default_factory=list)
    checks: list[CheckResult] = field(default_factory=list)
    parameters: dict = field(default_factory=dict)
    started: str = ""
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return all(n.status == "passed" for n in self.notebooks) and all(
            c.status in ("passed", "skipped") for c in self.checks
        )


def default_notebooks_dir() -> Path:
    here = Path.cwd() / "notebooks"
    if here.is_dir():
        return here
    return Path(__file__).resolve().parent.parent / "notebooks"


def discover(paths: list[str] | None = None) -> list[Path]:
    """The notebooks to run: the given ones (files or folders), else every NN_*.ipynb in notebooks/."""
    if not paths:
        paths = [str(default_notebooks_dir())]
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found.extend(sorted(q for q in p.glob(SERIES_GLOB)))
        elif p.is_file():
            found.append(p)
        else:
            raise ParameterError(f"notebook {str(p)!r} does not exist")
    if not found:
        raise ParameterError(f"no notebooks found in {', '.join(paths)}")
    return [p.resolve() for p in found]


def declared_parameters(nb) -> dict:
    """Names and default source of the `parameters` cell, read without executing it."""
    import ast

    for cell in nb.cells:
        if cell.cell_type == "code" and "parameters" in cell.get("metadata", {}).get("tags", []):
            out = {}
            try:
                tree = ast.parse(cell.source)
            except SyntaxError:
                return out
            for node in tree.body:
                if isinstance(node, ast.Assign):
                    for t in node.targets:
                        if isinstance(t, ast.Name):
                            out[t.id] = ast.unparse(node.value)
            return out
    return {}


def _cell_verdict(cell, check_id: str) -> tuple[str, str]:
    outputs = cell.get("outputs", [])
    errors = [o for o in outputs if o.get("output_type") == "error"]
    if errors:
        e = errors[0]
        value = str(e.get("evalue", "")).strip().splitlines()
        return "failed", f"{e.get('ename', 'Error')}: {value[0] if value else ''}".strip()
    if cell.get("execution_count") is None and not outputs:
        return "failed", "not run: the notebook stopped before this cell"
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    for status, cid, reason in VERDICT.findall(text):
        if cid == check_id:
            return ("passed", reason) if status == "PASSED" else ("skipped", reason)
    return "failed", "the assertion cell printed no verdict line"


def judge_checks(nb, notebook_name: str) -> list[CheckResult]:
    out = []
    for cell in nb.cells:
        for cid in check_ids(cell.get("metadata", {}).get("tags")):
            status, reason = _cell_verdict(cell, cid)
            out.append(CheckResult(cid, status, notebook_name, reason, cid in SEED_CHECKS))
    return out


def unexecuted_cells(nb) -> list[int]:
    return [
        i
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code" and c.source.strip() and c.get("execution_count") is None
    ]


def _error_summary(exc: BaseException) -> str:
    ename = getattr(exc, "ename", None)
    if ename:
        evalue = [ln.strip() for ln in str(getattr(exc, "evalue", "")).strip().splitlines()]
        cell = getattr(exc, "exec_count", None)
        fixes = [ln for ln in evalue[1:] if ln.lower().startswith("fix:")]  # keep what to do
        return " ".join([f"{ename}: {evalue[0] if evalue else ''}", *fixes, f"(cell In[{cell}])"])
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[-1] if lines else ''}"


def _parse_value(text: str):
    import yaml

    if not text.strip():
        return ""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def parse_params(items: list[str] | None) -> dict:
    params = {}
    for item in items or []:
        if "=" not in item:
            raise ParameterError(f"-p {item!r}: expected NAME=VALUE (e.g. -p num_processes=2)")
        name, value = item.split("=", 1)
        params[name.strip()] = _parse_value(value)
    return params


def run_notebooks(
    notebooks: list[Path],
    output_dir: Path,
    parameters: dict | None = None,
    *,
    kernel: str = DEFAULT_KERNEL,
    timeout: float | None = 1800,
    keep_work: bool = False,
    log=print,
    info: DeviceInfo | None = None,
) -> RunReport:
    import papermill as pm

    parameters = dict(parameters or {})
    output_dir.mkdir(parents=True, exist_ok=True)
    info = info or detect()
    sources = {p: nbformat.read(p, as_version=4) for p in notebooks}
    declared = {p: declared_parameters(nb) for p, nb in sources.items()}
    unknown = [k for k in parameters if not any(k in d for d in declared.values())]
    if unknown:
        names = sorted({k for d in declared.values() for k in d})
        raise ParameterError(f"parameter(s) {', '.join(unknown)} not declared by any notebook; declared: {', '.join(names)}")
    report = RunReport(device=info.to_dict(), parameters=parameters, started=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    run_root = Path(tempfile.mkdtemp(prefix="nbtools-run-"))
    saved = {k: os.environ.get(k) for k in (CACHE_ENV, "TMPDIR")}
    os.environ[CACHE_ENV] = json.dumps(info.raw)  # kernels reuse this probe instead of re-running it
    (run_root / "tmp").mkdir()
    os.environ["TMPDIR"] = str(run_root / "tmp")  # whatever kernels leave in TMPDIR goes with run_root
    t0 = time.monotonic()
    stop_reason = ""
    try:
        for i, path in enumerate(notebooks, 1):
            rel = path.name
            out_path = output_dir / path.name
            if stop_reason:
                report.notebooks.append(NotebookResult(rel, "not-run", error=stop_reason))
                report.checks.extend(
                    CheckResult(c.id, "failed", rel, stop_reason, c.seed) for c in judge_checks(sources[path], rel)
                )
                log(f"[{i}/{len(notebooks)}] {rel}: not run ({stop_reason})")
                continue
            nb_params = {k: v for k, v in parameters.items() if k in declared[path]}
            if "work_dir" in declared[path] and "work_dir" not in parameters:
                nb_params["work_dir"] = str(run_root / path.stem)
            log(f"[{i}/{len(notebooks)}] {rel}: running ...")
            start = time.monotonic()
            error = ""
            try:
                pm.execute_notebook(
                    str(path),
                    str(out_path),
                    parameters=nb_params,
                    kernel_name=kernel,
                    cwd=str(path.parent),
                    execution_timeout=timeout,
                    progress_bar=False,
                )
            except Exception as exc:  # papermill raises PapermillExecutionError, timeouts, dead kernels
                error = _error_summary(exc)
            duration = time.monotonic() - start
            executed = nbformat.read(out_path, as_version=4) if out_path.exists() else sources[path]
            if not error:
                pending = unexecuted_cells(executed)
                if pending:
                    error = f"{len(pending)} cell(s) never ran (first: cell {pending[0]}); did a cell call sys.exit()?"
            status = "failed" if error else "passed"
            report.notebooks.append(NotebookResult(rel, status, round(duration, 2), error, out_path.name))
            report.checks.extend(judge_checks(executed, rel))
            log(f"[{i}/{len(notebooks)}] {rel}: {status} ({duration:.1f} s){': ' + error if error else ''}")
            if error and not info.healthy:
                problem = next(p for p in info.problems if p.blocking)
                stop_reason = f"not run: the setup is broken ({problem.what}); fix: {problem.fix}"
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if keep_work:
            log(f"work dirs kept under {run_root}")
        else:
            shutil.rmtree(run_root, ignore_errors=True)
    report.duration_s = round(time.monotonic() - t0, 2)
    _add_unclaimed(report, notebooks)
    return report


def _add_unclaimed(report: RunReport, notebooks: list[Path]) -> None:
    """Every seed id gets an entry: not in this run's notebooks -> skipped (not selected) or missing."""
    have = {c.id for c in report.checks}
    others: dict[str, str] = {}
    folders = {p.parent for p in notebooks}
    for folder in folders:
        for p in sorted(folder.glob(SERIES_GLOB)):
            if p in notebooks:
                continue
            try:
                nb = nbformat.read(p, as_version=4)
            except Exception:
                continue
            for cell in nb.cells:
                for cid in check_ids(cell.get("metadata", {}).get("tags")):
                    others.setdefault(cid, p.name)
    for cid in SEED_CHECKS:
        if cid in have:
            continue
        if cid in others:
            report.checks.append(CheckResult(cid, "skipped", others[cid], f"not selected: {others[cid]} was not run", True))
        else:
            report.checks.append(CheckResult(cid, "missing", "", "no notebook cell is tagged check:" + cid, True))
    order = {cid: i for i, cid in enumerate(SEED_CHECKS)}
    report.checks.sort(key=lambda c: (order.get(c.id, len(order)), not c.seed))
