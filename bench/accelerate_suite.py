"""Accelerate's own test suite, run on this machine's CPU and on the simulated NPU, side by side.

    python bench/accelerate_suite.py [--files test_big_modeling test_hooks ...] [--only sim|cpu]
                                     [--junit-dir DIR] [--sdist PATH] [--fail-on-sim-failures]

Run from the repository root with the venv's Python (its `accelerate` command must be on PATH for the tests
that launch ranks; the script puts the interpreter's own bin/ in front). One run:

1. finds the installed accelerate's version (importlib.metadata) and downloads that release's sdist once,
   with `python -m pip download --no-deps --no-binary :all: accelerate==<ver>`, into
   ``~/.cache/accelerate-suite/<ver>/`` (``--sdist PATH``: a local tarball instead), and extracts its
   ``tests/`` folder (with whatever sub-folders that release ships under it). Support paths the chosen
   files name (``tests/test_configs``, ``tests/test_samples``, ...) that the sdist does not ship are listed.
   The test helpers accelerate's ``test_prod`` extra lists and the venv lacks (``parameterized``) are
   installed into that cache folder (never into the venv); ``--no-test-deps`` leaves them out. Other
   packages a chosen file imports and the venv lacks are listed per file (their tests skip or fail).
2. runs the chosen test files (default: test_accelerator, test_big_modeling, test_modeling_utils,
   test_hooks, test_state_checkpointing, test_kwargs_handlers, test_multidevice, test_compile, those that
   exist in that release) with ``pytest -p no:cacheprovider -q -rA --junitxml=...`` in a child process,
   twice: on the plain CPU, and on the simulated NPU of ``simnpu/`` (the environment of
   ``nbtools.simnpu_env.environment()``, 2 cards of the default SoC, its C++ part built first by
   ``nbtools.simnpu_env.prepare_simnpu()``). Both runs are offline (HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE,
   HF_DATASETS_OFFLINE), with CUDA hidden (CUDA_VISIBLE_DEVICES=""), and with a fresh, empty HF_HOME
   (no user `accelerate config` default file, no Hub cache). A simulated NPU that does not load is said,
   and the CPU results still come.
3. prints, per test file, the CPU's and the simulated NPU's passed / failed / skipped (a test whose
   subtest failed counts as failed; a file that fails to import counts one failed), the totals, and each
   test that failed on the simulated NPU with the first line of its error, marked when it is in KNOWN
   (failures no real NPU could pass either) or GAPS (what the stand-in still does differently, named in
   simnpu/README.md).

Time: the sdist's download and extraction take 5 to 15 s the first time (cached after that); with the
default files, the CPU run takes about 45 s and the simulated-NPU run about 3 minutes (its multi-process
tests launch 2 ranks each): 3 to 4 minutes in all on 2 CPU cores.

Exit code: 0 when it ran (the table is the output); with ``--fail-on-sim-failures``, 1 when a test failed
on the simulated NPU that neither KNOWN nor GAPS holds, or the simulated run did not produce results; 2 when the
sdist could not be had.
The junit files and the full pytest logs stay in ``--junit-dir`` (default: the cache folder's ``results/``).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.metadata
import importlib.util
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from nbtools import simnpu_env
from nbtools.errors import ParameterError

DEFAULT_FILES = (
    "test_accelerator",
    "test_big_modeling",
    "test_modeling_utils",
    "test_hooks",
    "test_state_checkpointing",
    "test_kwargs_handlers",
    "test_multidevice",
    "test_compile",
)
RUNS = {"cpu": "CPU", "sim": "simulated NPU"}
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
# Test helpers of accelerate's `test_prod` extra that its test files import (import name -> pip requirement):
# without parameterized a whole file fails to import; without torchdata, test_multidevice's data-loop launch
# fails (its script imports StatefulDataLoader). Installed into the cache, never the venv.
TEST_DEPS = {"parameterized": "parameterized", "torchdata": "torchdata"}
# Simulated-NPU failures that no real NPU could pass either: pytest node id -> why. Only such failures belong
# here (a test that needs the Hugging Face Hub or the network, which both runs have switched off; the bf16
# DDP compression hook, which torch allows only with CUDA + NCCL or XPU), never a shortcoming of simnpu.
KNOWN: dict[str, str] = {}
# Simulated-NPU failures from what the stand-in still does differently from the real torch_npu (each named,
# with a repro, in simnpu/README.md, "What it cannot tell"): node id -> the difference.
GAPS: dict[str, str] = {
    "tests/test_big_modeling.py::BigModelingTester::test_dispatch_model_multi_devices_compile_fullgraph":
        "torch.compile (inductor) of a model dispatched over two cards: the stand-in lends inductor the CPU's code "
        "generator, whose buffers carry no card index (one card compiles); torch_npu registers its own generator",
}


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "accelerate-suite"


# ---------------------------------------------------------------- 1. the sdist and its tests/
def download_sdist(version: str, folder: Path) -> Path:
    """The sdist of accelerate ``version`` in ``folder``, downloaded with pip the first time."""
    found = sorted(folder.glob(f"accelerate-{version}.tar.gz"))
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           f"accelerate=={version}", "-d", str(folder)]
    print(f"$ {shlex.join(cmd)}", flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(folder.glob("accelerate-*.tar.gz"))
    if proc.returncode != 0 or not found:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
        raise SystemExit(f"could not download the sdist of accelerate {version} (rc {proc.returncode}):\n{tail}\n"
                         "fix: pass a local tarball with --sdist PATH")
    return found[0]


def extract_tests(sdist: Path, dest: Path) -> Path:
    """Extract the sdist's ``tests/`` (every file under it) into ``dest``; the folder that holds ``tests/``.
    Done once per tarball: a marker file holds the tarball's digest."""
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    marker = dest / ".extracted-from"
    if marker.is_file() and marker.read_text().strip() == digest and (dest / "tests").is_dir():
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    with tarfile.open(sdist) as tar:
        members = []
        for m in tar.getmembers():
            parts = Path(m.name).parts
            if len(parts) >= 2 and parts[1] == "tests" and (m.isfile() or m.isdir()):
                m.name = str(Path(*parts[1:]))  # drop the `accelerate-<ver>/` top folder
                members.append(m)
        if not members:
            raise SystemExit(f"{sdist} has no tests/ folder")
        kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(dest, members=members, **kwargs)
    # An empty config of its own: pytest then reads no ini file above it (this repository's `-n auto`).
    (dest / "pytest.ini").write_text("[pytest]\n")
    marker.write_text(digest + "\n")
    return dest


def support_paths(files: list[Path], root: Path) -> dict[str, list[str]]:
    """Per file: the ``tests/...`` paths its text names that the extraction lacks (the sdist ships only some)."""
    out = {}
    for path in files:
        names = sorted(set(re.findall(r"""["'](tests/[\w./-]+)""", path.read_text(encoding="utf-8"))))
        missing = [n for n in names if not (root / n).exists()]
        if missing:
            out[path.stem] = missing
    return out


def imports(path: Path) -> tuple[set[str], set[str]]:
    """Top-level packages ``path`` imports: (at module level, unconditionally; elsewhere: in a function,
    an ``if`` or a ``try``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            top.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            top.add(node.module.split(".")[0])
    every: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            every.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            every.add(node.module.split(".")[0])
    return top, every - top


def missing_modules(files: list[Path], extra_path: list[str]) -> dict[str, tuple[list[str], list[str]]]:
    """Per file: (modules imported at module level that this interpreter lacks, other ones it lacks)."""
    sys.path[:0] = extra_path
    try:
        out = {}
        for path in files:
            top, other = imports(path)
            lack = [sorted(m for m in group if m not in sys.stdlib_module_names and m != "tests"
                           and importlib.util.find_spec(m) is None) for group in (top, other)]
            if lack[0] or lack[1]:
                out[path.stem] = (lack[0], lack[1])
        return out
    finally:
        del sys.path[:len(extra_path)]


def install_test_deps(names: list[str], target: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target", str(target),
           *(TEST_DEPS[n] for n in names)]
    print(f"$ {shlex.join(cmd)}", flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        print("could not install them (their files will fail to import):\n  "
              + "\n  ".join((proc.stderr or proc.stdout).strip().splitlines()[-5:]))


# ---------------------------------------------------------------- 2. the runs
@dataclass
class Result:
    name: str
    seconds: float = 0.0
    returncode: int | None = None
    problem: str | None = None  # why there are no results
    summary: str = ""  # pytest's closing line
    counts: dict[str, dict[str, int]] = field(default_factory=dict)  # file -> passed/failed/skipped
    failures: list[tuple[str, str]] = field(default_factory=list)  # (node id, first line of the error)


def base_environment(deps: Path | None) -> dict[str, str]:
    """os.environ, offline, CUDA hidden, this interpreter's bin/ in front of PATH (the tests call
    `accelerate launch`), the cached test helpers in front of PYTHONPATH, and no simnpu on it."""
    env = dict(os.environ)
    sim_site = str(simnpu_env.SIMNPU_ROOT / "site")
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.realpath(p) != sim_site]
    if deps is not None:
        paths.insert(0, str(deps))
    env["PYTHONPATH"] = os.pathsep.join(paths)
    if not env["PYTHONPATH"]:
        del env["PYTHONPATH"]
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    for key in ("SIMNPU_CARDS", "SIMNPU_SOC", "SIMNPU_FAULT", "ACCELERATE_CONFIG_FILE"):
        env.pop(key, None)
    env.update(OFFLINE)
    env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def run_pytest(name: str, env: dict[str, str], root: Path, files: list[Path], out: Path, timeout: float) -> Result:
    """pytest on ``files`` in a child process (its own session: a timeout ends the ranks it launched too)."""
    result = Result(name)
    xml, log = out / f"{name}.xml", out / f"{name}.log"
    xml.unlink(missing_ok=True)
    # --continue-on-collection-errors: a file that fails to import counts, and the others still run
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", f"--junitxml={xml}",
           "--continue-on-collection-errors",
           "-c", str(root / "pytest.ini"), "--rootdir", str(root), *(str(f.relative_to(root)) for f in files)]
    print(f"[{RUNS[name]}] $ {shlex.join(cmd)}   (in {root}; log: {log})", flush=True)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"accelerate-suite-{name}-") as home, open(log, "w") as fh:
        proc = subprocess.Popen(cmd, cwd=root, env={**env, "HF_HOME": home}, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            result.returncode = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            result.problem = f"timed out after {timeout:.0f} s"
    result.seconds = time.monotonic() - start
    lines = log.read_text(errors="replace").strip().splitlines()
    result.summary = lines[-1].strip("= ") if lines else ""
    if xml.is_file():
        parse_junit(xml, files, result)
    elif not result.problem:
        result.problem = f"pytest wrote no junit file (rc {result.returncode}): " + " | ".join(lines[-3:])
    print(f"[{RUNS[name]}] {result.seconds:.1f} s, rc {result.returncode}: {result.summary}", flush=True)
    return result


def first_line(element: ET.Element) -> str:
    text = (element.get("message") or "").strip()
    if not text or text == "collection failure":  # then the traceback's last `E   ` line says what it was
        body = [ln[1:].strip() for ln in (element.text or "").splitlines() if ln.startswith("E ")]
        text = body[-1] if body else text or (element.text or "").strip()
    line = text.splitlines()[0] if text else "(no message)"
    if re.search(r"failed with returncode \d+", line):  # a launched rank's own error says more than its launcher
        rank = re.search(r"^E\s+(\[rank\d+\]: \w*(?:Error|Exception)\b.*)$", element.text or "", re.MULTILINE)
        if rank:
            line = f"{line} -> {rank.group(1).strip()}"
    return line


def parse_junit(xml: Path, files: list[Path], result: Result) -> None:
    """Count per test file; a test case with a failure or error (its own or a subtest's) counts as failed."""
    stems = sorted((f.stem for f in files), key=len, reverse=True)
    result.counts = {f.stem: {"passed": 0, "failed": 0, "skipped": 0} for f in files}
    for case in ET.parse(xml).getroot().iter("testcase"):
        classname, name = case.get("classname") or "", case.get("name") or ""
        if not classname and name.startswith("tests."):  # a collection error: the module's dotted name
            classname, name = name, ""
        stem = next((s for s in stems if classname == f"tests.{s}" or classname.startswith(f"tests.{s}.")), None)
        if stem is None:
            continue
        inner = classname[len(f"tests.{stem}"):].lstrip(".")
        nodeid = "::".join([f"tests/{stem}.py", *(inner.split(".") if inner else []), *([name] if name else [])])
        bad = [e for e in case if e.tag in ("failure", "error")]
        if bad:
            result.counts[stem]["failed"] += 1
            result.failures.append((nodeid, first_line(bad[0])))
        elif case.find("skipped") is not None:
            result.counts[stem]["skipped"] += 1
        else:
            result.counts[stem]["passed"] += 1


def simulated_environment(env: dict[str, str]) -> tuple[dict[str, str] | None, str | None]:
    """The simulated NPU's environment on top of ``env``, its C++ part built; (None, why) when it does not load."""
    try:
        sim = {**env, **simnpu_env.environment(environ=env)}
        print("[simulated NPU] building / checking its C++ part (nbtools.simnpu_env.prepare_simnpu)", flush=True)
        simnpu_env.prepare_simnpu(sim, python=sys.executable)
    except (ParameterError, subprocess.TimeoutExpired, OSError) as exc:
        return None, f"the simulated NPU does not load: {exc}"
    return sim, None


# ---------------------------------------------------------------- 3. the table
def table(files: list[Path], results: dict[str, Result]) -> str:
    width = max(len("total"), *(len(f.stem) for f in files))
    heads = "".join(f" | {RUNS[n]:^22}" for n in results)
    sub = "".join(f" | {'passed':>7}{'failed':>7}{'skipped':>8}" for _ in results)
    lines = [f"{'':{width}}{heads}", f"{'test file':{width}}{sub}", "-" * (width + 25 * len(results))]
    totals = {n: {"passed": 0, "failed": 0, "skipped": 0} for n in results}
    for stem in [f.stem for f in files] + ["total"]:
        row = f"{stem:{width}}"
        for n, r in results.items():
            if r.problem and not r.counts:
                row += f" | {'-':>7}{'-':>7}{'-':>8}"
                continue
            c = totals[n] if stem == "total" else r.counts.get(stem, {"passed": 0, "failed": 0, "skipped": 0})
            if stem != "total":
                for k in c:
                    totals[n][k] += c[k]
            row += f" | {c['passed']:>7}{c['failed']:>7}{c['skipped']:>8}"
        if stem == "total":
            lines.append("-" * (width + 25 * len(results)))
        lines.append(row)
    lines.append(f"{'time':{width}}" + "".join(f" | {r.seconds:>20.1f} s" for r in results.values()))
    return "\n".join(lines)


def test_tree(version: str, cache: Path, local: Path | None) -> Path:
    """The folder holding the extracted ``tests/`` of accelerate ``version``'s sdist (``local``, or downloaded)."""
    start = time.monotonic()
    if local:
        if not local.is_file():
            raise SystemExit(f"--sdist {local}: no such file")
        sdist = local.resolve()
        root = extract_tests(sdist, cache / f"local-{hashlib.sha256(sdist.read_bytes()).hexdigest()[:12]}")
    else:
        sdist = download_sdist(version, cache)
        root = extract_tests(sdist, cache / "src")
    print(f"tests of {sdist.name}: {root / 'tests'} ({time.monotonic() - start:.1f} s)", flush=True)
    return root


def chosen_files(names: list[str] | None, root: Path, version: str) -> list[Path]:
    if names:
        names = [Path(n).name.removesuffix(".py") for n in names]
        absent = [n for n in names if not (root / "tests" / f"{n}.py").is_file()]
        if absent:
            raise SystemExit(f"not in accelerate {version}'s tests/: {', '.join(absent)}")
    else:
        names = [n for n in DEFAULT_FILES if (root / "tests" / f"{n}.py").is_file()]
        gone = [n for n in DEFAULT_FILES if n not in names]
        if gone:
            print(f"not in accelerate {version}'s tests/ (left out): {', '.join(gone)}")
    return [root / "tests" / f"{n}.py" for n in dict.fromkeys(names)]


def check_needs(files: list[Path], root: Path, deps: Path, install: bool) -> Path | None:
    """Say what the files need that is not here; install the missing test helpers into ``deps`` when
    ``install``. The folder to put on PYTHONPATH (``deps``), or None."""
    for stem, paths in support_paths(files, root).items():
        print(f"note: {stem} names {', '.join(paths)}, which the sdist does not ship (tests reading them fail)")
    lacking = missing_modules(files, [str(deps)] if deps.is_dir() else [])
    wanted = sorted(m for m in TEST_DEPS if importlib.util.find_spec(m) is None
                    and not (deps / m).exists())
    if wanted and install:
        print(f"accelerate's test helpers missing here: {', '.join(wanted)}; installing them into {deps}")
        install_test_deps(wanted, deps)
        importlib.invalidate_caches()
        lacking = missing_modules(files, [str(deps)])
    for stem, (top, other) in lacking.items():
        if top:
            print(f"missing for {stem} (imported at module level: the file fails to import): {', '.join(top)}")
        if other:
            print(f"missing for {stem} (imported conditionally: its tests that need them skip): {', '.join(other)}")
    return deps if deps.is_dir() else None


def report(files: list[Path], results: dict[str, Result]) -> list[str]:
    """Print the table and the simulated NPU's failures; the failed node ids that KNOWN does not hold."""
    print()
    print(table(files, results))
    for r in results.values():
        if r.problem:
            print(f"\n{RUNS[r.name]}: {r.problem}")
    unknown = []
    sim = results.get("sim")
    if sim is not None and sim.counts:
        print(f"\nfailed on the simulated NPU: {len(sim.failures)}")
        for nodeid, line in sim.failures:
            known = KNOWN.get(nodeid)
            gap = GAPS.get(nodeid)
            print(f"  {nodeid}" + (f"  [no NPU could pass: {known}]" if known else "")
                  + (f"  [the stand-in's difference: {gap}]" if gap else ""))
            print(f"      {line}")
            if not known and not gap:
                unknown.append(nodeid)
    return unknown


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", nargs="+", metavar="NAME",
                    help="test files of accelerate's tests/ (test_hooks, test_hooks.py or tests/test_hooks.py); "
                         "default: " + " ".join(DEFAULT_FILES))
    ap.add_argument("--only", choices=tuple(RUNS), help="one run only: the CPU or the simulated NPU")
    ap.add_argument("--junit-dir", type=Path, help="where the junit files and pytest logs go "
                                                   "(default: ~/.cache/accelerate-suite/<ver>/results)")
    ap.add_argument("--sdist", type=Path, help="a local accelerate sdist (.tar.gz) instead of downloading one")
    ap.add_argument("--fail-on-sim-failures", action="store_true",
                    help="exit 1 when a test failed on the simulated NPU that neither KNOWN nor GAPS holds")
    ap.add_argument("--no-test-deps", action="store_true",
                    help="do not install missing test helpers (" + ", ".join(TEST_DEPS) + ") into the cache")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per run (default 3600)")
    args = ap.parse_args(argv)

    try:
        version = importlib.metadata.version("accelerate")
    except importlib.metadata.PackageNotFoundError:
        raise SystemExit(f"accelerate is not installed for {sys.executable}") from None
    cache = cache_root() / version
    print(f"accelerate {version} ({sys.executable}); cache: {cache}", flush=True)
    root = test_tree(version, cache, args.sdist)
    files = chosen_files(args.files, root, version)
    deps = check_needs(files, root, cache / "deps", install=not args.no_test_deps)

    out = (args.junit_dir or cache / "results").resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = base_environment(deps)
    results: dict[str, Result] = {}
    for name in RUNS:
        if args.only and name != args.only:
            continue
        run_env: dict[str, str] | None = env
        if name == "sim":
            run_env, why = simulated_environment(env)
            if run_env is None:
                print(f"[{RUNS[name]}] {why}", flush=True)
                results[name] = Result(name, problem=why)
                continue
        results[name] = run_pytest(name, run_env, root, files, out, args.timeout)

    unknown = report(files, results)
    print(f"\njunit files and logs: {out}")
    sim = results.get("sim")
    if args.fail_on_sim_failures and sim is not None and (unknown or sim.problem):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
