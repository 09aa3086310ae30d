"""Execute the notebooks with papermill, as JupyterLab would, and judge every check.

- working directory = the notebook's folder (JupyterLab's behaviour, not papermill's);
- parameters injected only into notebooks that declare them;
- each notebook gets a private work dir under one run-level temp dir, removed at the end;
- a notebook that finished with cells that never ran (``sys.exit``) is failed;
- when the setup is broken (e.g. torch_npu without CANN), the first failure stops the
  run and the remaining notebooks are reported as not run, with the cause;
- ``-p NAME=VALUE`` is converted by the type of each notebook's own default, before any
  kernel starts;
- the device is probed with the kernel's own interpreter (``--kernel``);
- each check's verdict is held to its ``needs:`` tags weighed against that probe, the parameters given, whether the
  kernel finds deepspeed and whether the run may use the network (NBTOOLS_NETWORK=1, `run --network`): a pass or a
  skip other than expected fails (checks.Here.pinned);
- kernels run unattended (NBTOOLS_UNATTENDED=1), write UTF-8 whatever the locale, talk over
  IPC sockets, and log into ``<notebook>.kernel.log`` in the output dir, not the terminal; each
  notebook's kernel starts while the notebook before it runs (kernels.py);
- Ctrl-C, SIGTERM and SIGHUP interrupt the running kernel (its launches stop with it), shut
  it down, kill what is left of it after a grace period, and return what has been done.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from string import Template

import nbformat

from .checks import SEED_CHECKS, CheckResult, Here, Status, check_ids, judge_checks, unexecuted_cells, verdict
from .device import CACHE_ENV, DeviceInfo, detect, from_probe, run_probe
from .errors import ParameterError
from .kernels import KernelsAhead
from .lang import msg, of_metadata
from .params import convert_parameters, parameter_defaults
from .proctree import Stopper
from .run_results import CELL_TIMEOUT_S, DEFAULT_KERNEL, Failure, NotebookResult, RunReport

# NN_slug.ipynb, and NNx_slug.ipynb for a part that follows NN (01b_... after 01_...).
SERIES_GLOB = "[0-9][0-9]*_*.ipynb"
KERNEL_LOG = "{stem}.kernel.log"  # in the output dir: the kernel process' own stdout/stderr
NETWORK_ENV = "NBTOOLS_NETWORK"  # "1": the run may reach beyond the package registries (`run --network`)


def default_notebooks_dir() -> Path:
    here = Path.cwd() / "notebooks"
    return here if here.is_dir() else Path(__file__).resolve().parent.parent / "notebooks"


def discover(paths: list[str] | None = None) -> list[Path]:
    """The notebooks to run: the given ones (files or folders), else every NN_*.ipynb in notebooks/."""
    paths = paths or [str(default_notebooks_dir())]
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found.extend(sorted(p.glob(SERIES_GLOB)))
        elif p.is_file():
            found.append(p)
        else:
            raise ParameterError(f"notebook {str(p)!r} does not exist")
    if not found:
        raise ParameterError(f"no notebooks found in {', '.join(paths)}")
    return [p.resolve() for p in found]


def here_for(info: DeviceInfo, params: dict, defaults: dict, *, deepspeed: bool, network: bool) -> Here:
    """What a notebook run with ``params`` (its ``defaults`` otherwise) may do on ``info``'s machine."""
    kind = "cpu" if params.get("device", defaults.get("device")) == "cpu" else info.kind
    given = frozenset(k for k, v in params.items() if k in defaults and v != defaults[k])
    processes = params.get("num_processes", defaults.get("num_processes", 2))
    return Here(kind, info.count, info.simulated, info.bf16, deepspeed, network, given, processes)


def finds(python: str, module: str, env: dict | None = None) -> bool:
    """Does interpreter ``python`` find ``module`` (importlib's find_spec, nothing imported)?"""
    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    return subprocess.run([python, "-c", code], env=env, capture_output=True, timeout=120).returncode == 0


# --- the kernel: its interpreter, its environment, its log, and how it is stopped ----------


def kernel_python(name: str) -> tuple[str, dict]:
    """The interpreter and extra environment of Jupyter kernel ``name`` (its kernelspec's argv[0]
    and ``env``, with ``${VAR}`` references filled from this environment, as jupyter_client does
    when it starts the kernel).

    Raises ParameterError listing the installed kernels when there is no such kernel.
    """
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    ksm = KernelSpecManager()
    try:
        spec = ksm.get_kernel_spec(name)
    except NoSuchKernel:
        names = sorted(ksm.find_kernel_specs())
        raise ParameterError(f"--kernel {name!r}: no such Jupyter kernel; installed (`jupyter kernelspec list`): "
                             + (", ".join(names) or "none")) from None
    exe = spec.argv[0] if spec.argv else sys.executable
    # jupyter_client itself starts 'python'/'python3' kernels with its own interpreter
    if exe in {"python", f"python{sys.version_info[0]}", "python{}.{}".format(*sys.version_info[:2])}:
        exe = sys.executable
    elif not os.path.isabs(exe):
        exe = shutil.which(exe) or exe
    return exe, {k: Template(v).safe_substitute(os.environ) for k, v in (spec.env or {}).items()}


def detect_for_kernel(name: str = DEFAULT_KERNEL) -> DeviceInfo:
    """What the notebooks will see: the device probed with kernel ``name``'s own interpreter and
    environment (this one, with the kernel spec's ``env`` over it, as Jupyter starts the kernel)."""
    exe, env = kernel_python(name)
    if os.path.abspath(exe) == os.path.abspath(sys.executable) and not env:
        return detect()
    kernel_env = {**os.environ, **env}
    return from_probe(run_probe(python=exe, env=kernel_env), environ=kernel_env)


# --- the run ---------------------------------------------------------------------------------


@dataclass
class _Notebooks:
    """The run's notebooks and their parameters: what is read and checked before any kernel starts."""

    notebooks: list[Path]
    parameters: dict  # as given (text from -p)
    sources: dict  # path -> the notebook as read
    declared: dict  # path -> its declared parameters and their defaults
    converted: dict  # path -> the parameters it gets, converted by its own defaults

    @classmethod
    def read(cls, notebooks: list[Path], parameters: dict) -> _Notebooks:
        """Raises ParameterError for two notebooks of one name (a notebook and its English twin: their executed copies,
        kernel logs and report entries would share that name), a parameter no notebook declares or a value that does
        not convert."""
        if twice := sorted({p.name for p in notebooks if [q.name for q in notebooks].count(p.name) > 1}):
            raise ParameterError(f"{', '.join(twice)}: two notebooks of one name in one run (their executed copies and "
                                 "reports would share it); run each edition in its own `nbtools run -o DIR`")
        sources = {p: nbformat.read(p, as_version=4) for p in notebooks}
        declared = {p: parameter_defaults(p) for p in notebooks}
        if unknown := [k for k in parameters if not any(k in d for d in declared.values())]:
            names = sorted({k for d in declared.values() for k in d})
            raise ParameterError(f"parameter(s) {', '.join(unknown)} not declared by any notebook; declared: {', '.join(names)}")
        converted = {p: convert_parameters(parameters, declared[p], p.name) for p in notebooks}
        return cls(notebooks, parameters, sources, declared, converted)


@dataclass
class _Run:
    """One `run_notebooks` call: runs its notebooks one by one into ``report``."""

    selected: _Notebooks
    report: RunReport
    info: DeviceInfo
    output_dir: Path
    run_root: Path
    kernels: KernelsAhead
    stopper: Stopper
    timeout: float | None
    needs: dict  # deepspeed / network: what here_for takes besides the probe
    stop: tuple = ()  # why the notebooks left are not run: a catalogue key and its values

    def stop_reason(self, path: Path) -> str:
        return msg(self.stop[0], of_metadata(self.selected.sources[path].metadata), **self.stop[1]) if self.stop else ""

    def notebook(self, i: int, path: Path) -> None:
        """Run notebook ``i`` (1-based) and add its result and its checks to the report."""
        where = f"[{i}/{len(self.selected.notebooks)}] {path.name}"
        if self.stopper.signum and not self.stop:
            self.stop = ("runner.stopped", {"name": self.stopper.name})
        if self.stop:
            self.not_run(path)
            print(f"{where}: not run ({self.stop_reason(path)})")
            return
        nb_params = dict(self.selected.converted[path])  # and a private work_dir under run_root where it declares one
        if "work_dir" in self.selected.declared[path] and "work_dir" not in self.selected.parameters:
            nb_params["work_dir"] = str(self.run_root / path.stem)
        out_path = self.output_dir / path.name
        print(f"{where}: running ...")
        start = time.monotonic()
        nxt = self.selected.notebooks[i] if i < len(self.selected.notebooks) else None
        failure = self.execute(path, nb_params, nxt)
        duration = time.monotonic() - start
        executed = nbformat.read(out_path, as_version=4) if out_path.exists() else self.selected.sources[path]
        if failure is not None and failure.exec_count is not None:  # the check of the cell that raised, found by In[n]
            cell = next((c for c in executed.cells if c.get("execution_count") == failure.exec_count), {})
            failure.check_id = next(iter(check_ids(cell.get("metadata", {}).get("tags"))), "")
        error = self.explain(failure, executed)
        status = Status.FAILED if error else Status.PASSED
        output = out_path.name if out_path.exists() else ""
        self.report.notebooks.append(NotebookResult(path.name, status, round(duration, 2), error, output,
                                                    self.kernels.log_for(path).name, nb_params, failure))
        here = here_for(self.info, self.selected.converted[path], self.selected.declared[path], **self.needs)
        self.report.checks.extend(judge_checks(executed, path.name, here=here))  # each verdict held to its needs
        print(f"{where}: {status} ({duration:.1f} s){': ' + error if error else ''}")
        if error and not self.stopper.signum and not self.info.healthy:
            problem = next(p for p in self.info.problems if p.blocking)
            self.stop = ("runner.broken_setup", {"what": problem.what, "fix": problem.fix})

    def not_run(self, path: Path) -> None:
        rel, reason = path.name, self.stop_reason(path)
        self.report.notebooks.append(NotebookResult(rel, Status.NOT_RUN, error=reason))
        self.report.checks.extend(judge_checks(self.selected.sources[path], rel, not_run=reason))

    def execute(self, path: Path, nb_params: dict, nxt: Path | None) -> Failure | None:
        """Run ``path`` with papermill in its kernel (started ahead, shut down at the end); start
        the kernel of the notebook ``nxt`` after it meanwhile. Its failure, or None."""
        import papermill as pm

        try:
            with self.kernels.running(path) as state, self.stopper.watching(state):
                if nxt is not None and not self.stopper.signum:
                    self.kernels.ahead(nxt)  # the next notebook's kernel boots while this one runs
                pm.execute_notebook(  # km: passed on to nbclient, which leaves it running: `running` shuts it down
                    str(path), str(self.output_dir / path.name), parameters=nb_params, kernel_name=self.kernels.kernel,
                    cwd=str(path.parent), execution_timeout=self.timeout, progress_bar=False, km=state.km,
                    on_cell_execute=state.on_cell_execute, on_cell_executed=state.on_cell_executed)
        except Exception as exc:  # papermill raises PapermillExecutionError, timeouts, dead kernels
            return Failure.of(exc)
        except KeyboardInterrupt:  # a signal before our handlers, or a cell refused after a stop
            return Failure("KeyboardInterrupt")
        return None

    def explain(self, failure: Failure | None, executed) -> str:
        """The notebook's error as the report says it: what a stop signal did, cells that never ran."""
        error, lang = (failure.summary() if failure else ""), of_metadata(executed.metadata)
        if self.stopper.signum:
            where = failure.summary(name=failure.ename not in ("KeyboardInterrupt", "RunStopped")) if failure else ""
            return msg("runner.stopped_kernel", lang, name=self.stopper.name) + (msg("sep", lang) + where if where else "")
        if not error and (pending := unexecuted_cells(executed)):
            return msg("runner.cells_not_run", lang, n=len(pending), first=pending[0])
        return error


def run_notebooks(notebooks: list[Path], output_dir: Path, parameters: dict | None = None, *, kernel: str = DEFAULT_KERNEL,
                  timeout: float | None = CELL_TIMEOUT_S, keep_work: bool = False, info: DeviceInfo | None = None) -> RunReport:
    """Run ``notebooks`` one after the other, each in a fresh kernel, and judge their checks.

    ``parameters``: name -> value; a text value (``-p``) is converted per notebook by the type
    of that notebook's default. Every conversion is checked before the first kernel starts.
    Progress goes to stdout (redirect it to silence the run). The run may reach beyond the package
    registries only when NBTOOLS_NETWORK=1 says so (`run --network`); checks tagged ``needs:network`` are expected to
    skip without it.
    """
    selected = _Notebooks.read(notebooks, dict(parameters or {}))
    info = info or detect_for_kernel(kernel)
    exe, env = kernel_python(kernel)
    needs = {"deepspeed": finds(exe, "deepspeed", {**os.environ, **env}),
             "network": os.environ.get(NETWORK_ENV) == "1"}
    output_dir = Path(output_dir).resolve()  # kernels run in the notebooks' folders: a relative path would move
    output_dir.mkdir(parents=True, exist_ok=True)
    report = RunReport(device={**info.to_dict(), **needs}, parameters=selected.parameters,  # needs: what the pin weighed
                       started=time.strftime("%Y-%m-%dT%H:%M:%S%z"), kernel=kernel)
    t0 = time.monotonic()
    with contextlib.ExitStack() as stack:  # on the way out: unused kernels, then leftovers, then the work dirs
        # the run's private temp folder: the notebooks' work dirs, the kernels' TMPDIR (tmp/) and IPC sockets
        run_root = Path(tempfile.mkdtemp(prefix="nbtools-run-"))
        if keep_work:
            stack.callback(print, f"work dirs kept under {run_root}")
        else:
            stack.callback(shutil.rmtree, run_root, ignore_errors=True)
        (run_root / "tmp").mkdir()
        stopper = stack.enter_context(Stopper())
        # Kernels reuse this probe instead of re-running it; whatever they leave in TMPDIR goes with run_root.
        kernel_env = {CACHE_ENV: json.dumps(info.raw), "TMPDIR": str(run_root / "tmp")}
        kernels = stack.enter_context(
            KernelsAhead(kernel, lambda p: output_dir / KERNEL_LOG.format(stem=p.stem), run_root / "k", kernel_env)
        )
        run = _Run(selected, report, info, output_dir, run_root, kernels, stopper, timeout, needs)
        for i, path in enumerate(notebooks, 1):
            run.notebook(i, path)
    report.stopped_by = stopper.name
    report.duration_s = round(time.monotonic() - t0, 2)
    _add_unclaimed(report, selected.sources)
    return report


def _add_unclaimed(report: RunReport, run: dict) -> None:
    """Every seed id gets an entry: not in this run's notebooks (``run``: path -> the notebook as read) -> skipped
    (not selected) or missing."""
    have, notebooks = {c.id for c in report.checks}, list(run)
    others: dict[str, str] = {}
    lang = of_metadata(next(iter(run.values())).metadata) if run else None
    # an English notebook's series is notebooks/en/ and, where not yet translated, its Chinese twins' folder
    folders = {p.parent for p in notebooks} | {p.parent.parent for p, nb in run.items() if of_metadata(nb.metadata) != "zh"}
    for folder in sorted(folders):
        for p in sorted(set(folder.glob(SERIES_GLOB)) - set(notebooks)):
            for cell in nbformat.read(p, as_version=4).cells:
                for cid in check_ids(cell.get("metadata", {}).get("tags")):
                    others.setdefault(cid, p.name)
    for cid in (c for c in SEED_CHECKS if c not in have):
        status, reason = verdict(None, cid, lang, elsewhere=others.get(cid, ""))
        report.checks.append(CheckResult(cid, status, others.get(cid, ""), reason, True))
    order = {cid: i for i, cid in enumerate(SEED_CHECKS)}
    report.checks.sort(key=lambda c: (order.get(c.id, len(order)), not c.seed))
