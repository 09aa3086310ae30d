"""Benchmark: the quick-start's commands run bare beside the notebooks that hold its checks.

    python bench/bench.py [--output DIR] [--rounds N] [--repeat N] [--skip-series] [--skip-memory]

Run from the repository root, outside CI (a full run takes several minutes). One run measures:

1. bare: the quick-start's own commands as a learner runs them in a terminal. They are read from the
   notebooks themselves (their `%%writefile`, `%cmd`, `%%cmd` and `%launch` cells, in order, with
   the parameters' defaults); each runs as the command line its cell prints (`$ ...`, or `# runs
   here as: ...` where this machine needs another), with plain bash: no kernel, no nbtools launcher
   or guardian, no checks. There is one copy of those commands: the notebooks.
2. series: `python -m nbtools run` on the same notebooks (kernel, checks, reports).
3. both side by side per notebook, medians of ``--rounds`` rounds whose order alternates (bare
   first, then series first: a warm page cache or a load change favours neither), with the ratio
   series / bare (target: at most 1.05x), and where the difference goes: the command cells beyond
   the bare commands (the launcher, its guardian, the printed lines), the other cells (checks,
   pictures), and Jupyter's own (kernel handshake, saving, shutdown);
4. launch overhead: `python -m nbtools launch` against a plain `accelerate launch` of the same
   script with the same flags (target: at most 0.3 s more);
5. memory: the quick-start's Llama as an `init_empty_weights` skeleton (target: under 1 MB of
   tensors) and the peak RAM growth of `load_checkpoint_and_dispatch` against the checkpoint size;
6. the slowest cells of the executed notebooks.

Everything lands in DIR/bench-results.json; the figures are printed side by side.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from IPython.core.inputtransformer2 import TransformerManager

import nbtools
from nbtools import commands, decide, magics
from nbtools.checks import SEED_CHECKS, check_ids
from nbtools.decide import launch_spec
from nbtools.guarded import ABORT_RERUN_SAID, free_port, write_files
from nbtools.params import NO_DEFAULT, parameter_defaults
from nbtools.proctree import is_alive, remember, terminate_then_kill
from nbtools.runner import SERIES_GLOB

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
TARGETS = {"series_vs_bare": 1.05, "launch_overhead_s": 0.3, "skeleton_bytes": 1e6}
_TRANSFORM = TransformerManager()  # IPython's own reading of a cell: `%launch ...` -> run_line_magic(...)


# ---------------------------------------------------------------- 1. the quick-start's commands, bare
def seed_notebooks(folder: Path = NOTEBOOKS) -> list[Path]:
    """The notebooks holding at least one of the quick-start's 12 checks, in series order."""
    found = []
    for path in sorted(folder.glob(SERIES_GLOB)):
        nb = nbformat.read(path, as_version=4)
        if any(cid in SEED_CHECKS for c in nb.cells for cid in check_ids(c.get("metadata", {}).get("tags"))):
            found.append(path)
    return found


def steps(nb, namespace: dict) -> list[tuple[str, str, str]]:
    """(kind, argument, body) of the notebook's command cells, in order: write / cmd / launch.

    A command inside an ``if`` counts when its condition holds here with the parameters'
    defaults (``if accelerate_ref:`` does not: the source install needs ``accelerate_ref``;
    ``if S.info.kind == "npu":`` holds only on an NPU); a condition on the kernel's own results
    (``if bf16_ok:``) cannot be told beforehand and counts.
    """
    out = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        head, _, body = cell.source.partition("\n")
        if head.startswith("%%writefile"):
            out.append(("write", head.split(None, 1)[1].strip().strip("\"'"), body))
        elif head.startswith("%%cmd"):
            options = " ".join(w for w in head.split()[1:] if w.startswith("--"))
            out.append(("cmd", options, body))
        elif "%cmd" in cell.source or "%launch" in cell.source:
            out += _line_magics(_TRANSFORM.transform_cell(cell.source), namespace)
    return out


def _line_magics(code: str, namespace: dict) -> list[tuple[str, str, str]]:
    found = []

    def visit(node, conditions):
        if isinstance(node, ast.If):
            for child in node.body:
                visit(child, [*conditions, node.test])
            for child in node.orelse:
                visit(child, [*conditions, ast.UnaryOp(ast.Not(), node.test)])
            return
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", "") == "run_line_magic"
            and len(node.args) == 2
            and all(isinstance(a, ast.Constant) for a in node.args)
            and node.args[0].value in ("cmd", "launch")
            and all(_holds(c, namespace) for c in conditions)
        ):
            found.append((node.args[0].value, "", node.args[1].value))
        for child in ast.iter_child_nodes(node):
            visit(child, conditions)

    visit(ast.parse(code), [])
    return found


def _holds(test, namespace: dict) -> bool:
    try:
        return bool(eval(compile(ast.Expression(ast.fix_missing_locations(test)), "<if>", "eval"), {}, dict(namespace)))
    except Exception:  # a name only the kernel knows (a result): assume the default path runs it
        return True


def defaults(path: Path) -> dict:
    """The parameters cell's literal defaults."""
    return {k: v for k, v in parameter_defaults(path).items() if v is not NO_DEFAULT}


def terminal_line(kind: str, text: str, info, device: str, cwd: Path) -> str | None:
    """The command line a cell prints for ``%cmd``/``%launch`` ``text`` (``$ ...``, or ``# runs here as:``
    when this machine needs another): what a learner pastes into a terminal. None: not on this machine."""
    if kind == "cmd":
        try:
            real = commands.command_here(commands.parse(text), info, device)
        except commands.CommandNotHere:  # npu-smi off an Ascend host: the notebook skips it too
            return None
        return commands.shell_line(real.argv, real.env)
    call = decide.parse_launch(text)  # the count not written: the session's (launch_spec, the normaliser)
    spec = launch_spec(call, info=info, device=device, timeout=None, cwd=cwd)
    write_files(spec.files)  # the --config_file it names, as a launch writes it
    return spec.shown(spec.port or free_port() if spec.num_processes > 1 else None)


def _bash(line: str, cwd: Path) -> tuple[int, str]:
    """``line`` in bash, as a terminal runs it: the venv's bin on PATH (an activated venv), nothing else."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    proc = subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr


def run_bare(path: Path, log=print) -> dict:
    """One notebook's quick-start commands as a learner runs them in a terminal, timed: its scripts
    written, then each command line its cells print, run with plain bash in one folder. No kernel,
    no nbtools launcher or guardian, no checks. A command that fails is run again (at most twice:
    gloo's teardown abort on a CPU, which the notebooks rerun too); both runs count."""
    nb = nbformat.read(path, as_version=4)
    params = defaults(path)
    origin = Path.cwd()
    work = tempfile.mkdtemp(prefix=f"nbtools-bench-{path.stem}-")
    with contextlib.redirect_stdout(io.StringIO()):  # untimed: the notebook's setup cell, for the names its commands use
        session = nbtools.setup(**{k: params[k] for k in ("device", "num_processes", "timeout_s") if k in params},
                                work_dir=work)
    os.chdir(origin)
    device, info = params.get("device", "auto"), session.info
    namespace = dict(params, S=session)
    folder = Path(session.work)
    timings, reruns, failed = [], 0, []
    start = time.monotonic()
    for kind, arg, body in steps(nb, namespace):
        t0 = time.monotonic()
        if kind == "write":
            (folder / magics.expand_fields(arg, namespace)).write_text(body + "\n")
            continue
        line = terminal_line(kind, magics.expand_fields(f"{arg} {body}".strip(), namespace), info, device, folder)
        if line is None:
            continue
        for attempt in range(3):
            code, output = _bash(line, folder)
            if code == 0:
                break
            reruns += attempt < 2
        if code != 0 and "--allow-fail" not in arg + body:
            failed.append(f"{line[:80]} (exit {code}): {output.strip().splitlines()[-1:] or ''}")
        timings.append({"kind": kind, "command": line[:120], "s": round(time.monotonic() - t0, 2)})
    total = round(time.monotonic() - start, 2)
    with contextlib.redirect_stdout(io.StringIO()):
        session.close()
    os.chdir(origin)
    shutil.rmtree(work, ignore_errors=True)
    log(f"  bare {path.name}: {total:.1f} s ({len(timings)} commands{f', {reruns} rerun(s)' if reruns else ''})")
    for f in failed:
        log(f"    FAILED bare: {f}")
    return {"notebook": path.name, "wall_s": total, "steps": timings, "reruns": reruns, "failed": failed}


# ---------------------------------------------------------------- 2. the same notebooks as a series
def run_series(paths: list[Path], out: Path, log=print, options: tuple[str, ...] = ()) -> dict:
    start = time.monotonic()
    proc = subprocess.run(  # `nbtools run` stops its own kernels and launches on any way out
        [sys.executable, "-m", "nbtools", "run", *options, *map(str, paths), "--output", str(out)],
        capture_output=True,
        text=True,
    )
    wall = round(time.monotonic() - start, 2)
    report = json.loads((out / "report.json").read_text())
    per = {n["path"]: n["duration_s"] for n in report["notebooks"]}
    reruns = sum(p.read_text(encoding="utf-8").count(ABORT_RERUN_SAID) for p in out.glob("*.ipynb"))
    log(f"  series: {report['duration_s']:.1f} s, {report['summary']['checks']}{f', {reruns} launch rerun(s)' if reruns else ''}")
    if proc.returncode != 0:
        log(proc.stdout[-3000:])
    return {"wall_s": wall, "run_s": report["duration_s"], "ok": proc.returncode == 0, "reruns": reruns, "per_notebook_s": per,
            "split": {p.name: time_split(p, per.get(p.name, 0.0)) for p in sorted(out.glob("*.ipynb"))},
            "output": str(out)}


def time_split(path: Path, total: float) -> dict:
    """Where one executed notebook's time went: its command cells, its other cells, Jupyter's own."""
    nb = nbformat.read(path, as_version=4)
    split = {"commands_s": 0.0, "other_cells_s": 0.0}
    for cell in nb.cells:
        duration = cell.get("metadata", {}).get("papermill", {}).get("duration")
        if cell.cell_type == "code" and duration:
            is_command = any(m in cell.source for m in ("%cmd", "%launch"))
            split["commands_s" if is_command else "other_cells_s"] += duration
    split["jupyter_s"] = total - split["commands_s"] - split["other_cells_s"]
    return {k: round(v, 2) for k, v in split.items()}


def rounds(paths: list[Path], out: Path, count: int, skip_series: bool, log=print) -> tuple[list, dict | None]:
    """``count`` rounds of bare and series, the order alternating; per notebook, the medians."""
    bare_runs, series_runs = [], []
    for r in range(count):
        log(f" round {r + 1}/{count}")
        order = ["bare", "series"] if r % 2 == 0 else ["series", "bare"]
        for what in order:
            if what == "bare":
                bare_runs.append([run_bare(p, log) for p in paths])
            elif not skip_series:
                series_runs.append(run_series(paths, out / f"series-{r + 1}", log))
    bare_totals = [round(sum(nb["wall_s"] for nb in run), 2) for run in bare_runs]
    bare = []
    for i, p in enumerate(paths):
        walls = [run[i]["wall_s"] for run in bare_runs]
        bare.append({"notebook": p.name, "wall_s": round(statistics.median(walls), 2), "runs_s": walls,
                     "steps": bare_runs[-1][i]["steps"]})
    bare[0]["round_totals_s"] = bare_totals  # the whole bare path, per round
    bare[0]["round_reruns"] = [sum(nb.get("reruns", 0) for nb in run) for run in bare_runs]
    if not series_runs:
        return bare, None
    series = {"per_notebook_s": {}, "runs": series_runs, "ok": all(s["ok"] for s in series_runs),
              "run_s": round(statistics.median(s["run_s"] for s in series_runs), 2), "split": {}}
    for p in paths:
        series["per_notebook_s"][p.name] = round(statistics.median(s["per_notebook_s"][p.name] for s in series_runs), 2)
        series["split"][p.name] = {k: round(statistics.median(s["split"][p.name][k] for s in series_runs), 2)
                                   for k in ("commands_s", "other_cells_s", "jupyter_s")}
    series["output"] = series_runs[-1]["output"]
    # the rounds paired: the same load and cache state for both halves of a round
    series["paired_ratios"] = [round(sr["run_s"] / bt, 3) for sr, bt in zip(series_runs, bare_totals)]
    # a gloo teardown abort reruns a whole launch (about 7 s here): rounds where neither side had one
    series["clean_rounds"] = [i for i, sr in enumerate(series_runs)
                              if sr["reruns"] == 0 and bare[0]["round_reruns"][i] == 0]
    return bare, series


def cpu_vs_simulated(out: Path, log=print) -> dict:
    """The whole series twice: on this machine as it is, and on the simulated NPU (``--simulate-npu``)."""
    everything = sorted(NOTEBOOKS.glob("[0-9][0-9]*_*.ipynb"))
    log(" the whole series, as this machine is, then on the simulated NPU")
    return {"here": run_series(everything, out / "series-here", log),
            "simulated": run_series(everything, out / "series-simulated-npu", log, ("--simulate-npu",))}


def slowest_cells(out: Path, top: int = 8) -> list[dict]:
    cells = []
    for path in sorted(out.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        for i, cell in enumerate(nb.cells):
            duration = cell.get("metadata", {}).get("papermill", {}).get("duration")
            if cell.cell_type == "code" and duration:
                first = next((ln for ln in cell.source.splitlines() if ln.strip()), "")
                cells.append({"notebook": path.name, "cell": i, "s": round(duration, 2), "source": first[:70]})
    return sorted(cells, key=lambda c: -c["s"])[:top]


def warm_up() -> None:
    """Read the libraries every command imports once, untimed, so that the first round's first
    command does not pay for a cold page cache that no later command pays for."""
    subprocess.run([sys.executable, "-c", "import torch, accelerate, transformers"], capture_output=True)


# ---------------------------------------------------------------- 4. launch overhead
TINY = "from accelerate import Accelerator\na = Accelerator()\na.print(f'world={a.num_processes}')\na.end_training()\n"


def _timed(cmd: list[str], env: dict | None = None, timeout: float = 600, cwd: Path | None = None) -> float:
    """Wall seconds of ``cmd``; on a timeout or a failure its whole tree is stopped (ranks included)."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    known: dict = {}  # pid -> psutil.Process: the command and every descendant seen
    try:
        while proc.poll() is None:
            remember(proc.pid, known)  # torch elastic starts its ranks in sessions of their own: remember them
            if time.monotonic() - start > timeout:
                raise TimeoutError(f"{shlex.join(cmd)} ran past {timeout:.0f} s")
            time.sleep(0.05)
    finally:
        terminate_then_kill([p for p in known.values() if is_alive(p)])  # what is left: the ranks included
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} exited {proc.returncode}")
    return time.monotonic() - start


def _spec_env(spec) -> dict:
    """This environment with the variables of the launch ``spec`` (the normaliser's; None: removed)."""
    return {k: v for k, v in {**os.environ, **spec.run_env(), "PYTHONUNBUFFERED": "1"}.items() if v is not None}


def launch_overhead(scratch: Path, repeat: int, log=print) -> dict:
    script = scratch / "tiny_launch.py"
    script.write_text(TINY)
    spec = launch_spec(decide.LaunchCall.of(script), timeout=None, cwd=scratch)  # the launch nbtools runs
    write_files(spec.files)
    env = _spec_env(spec)
    ours_cmd = [sys.executable, "-m", "nbtools", "launch", str(script)]  # the same count: the one default
    _timed(ours_cmd)  # fills the probe cache, as any first call does
    plain, ours = [], []
    for i in range(repeat):  # pairs, their order alternating, so that a load change hits both alike
        runs = {"plain": lambda: _timed(spec.argv(free_port() if spec.num_processes > 1 else None), env=env, cwd=scratch),  # its config file is there
                "ours": lambda: _timed(ours_cmd)}
        got = {name: runs[name]() for name in (("plain", "ours") if i % 2 == 0 else ("ours", "plain"))}
        plain.append(got["plain"])
        ours.append(got["ours"])
    # the median of each pair's own difference: the ranks' run time varies by about a second between runs on a
    # busy machine, and a difference of two medians keeps that noise
    diffs = [o - p for o, p in zip(ours, plain)]
    res = {"plain_s": round(statistics.median(plain), 2), "nbtools_s": round(statistics.median(ours), 2),
           "overhead_s": round(statistics.median(diffs), 2), "pairs": repeat,
           "differences_s": [round(d, 2) for d in diffs]}
    log(f"  launch: plain {res['plain_s']:.2f} s, nbtools {res['nbtools_s']:.2f} s, "
        f"overhead {res['overhead_s']:+.2f} s (medians of {repeat} alternating pairs)")
    return res


# ---------------------------------------------------------------- 4b. where a launch's time goes
def _cpu_timed(cmd: list[str], env: dict | None = None, cwd: Path | None = None) -> tuple[float, float]:
    """(wall, CPU) seconds of ``cmd`` and every process it waited for (the ranks of an accelerate launch)."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = _timed(cmd, env=env, cwd=cwd)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def launch_parts(scratch: Path, repeat: int, log=print) -> dict:
    """01's launches taken apart: the imports every process pays, a 2-rank launch that only starts and stops
    (per-launch start-up), the same launch of 01's train_npu.py (its steps, the first one's compile included), and
    that script in one process on this machine's device (no launch: what the stand-in route adds is the difference)."""
    nb = nbformat.read(NOTEBOOKS / "01_training.ipynb", as_version=4)
    train = next(c.source for c in nb.cells if c.source.startswith("%%writefile train_npu.py"))
    (scratch / "train_npu.py").write_text(train.split("\n", 1)[1])
    (scratch / "tiny_launch.py").write_text(TINY)
    tiny, train = (launch_spec(decide.LaunchCall.of(scratch / name), timeout=None, cwd=scratch)
                   for name in ("tiny_launch.py", "train_npu.py"))
    write_files((*tiny.files, *train.files))
    env = _spec_env(tiny)
    parts = {"import torch": [sys.executable, "-c", "import torch"],
             "import torch + accelerate": [sys.executable, "-c", "import torch; from accelerate import Accelerator"],
             "train_npu.py, 1 process": [sys.executable, str(scratch / "train_npu.py")],
             "2-rank launch, start and stop only": tiny,
             "2-rank launch of train_npu.py": train}
    res = {}
    for name, cmd in parts.items():
        runs = [_cpu_timed(cmd.argv(free_port() if cmd.num_processes > 1 else None) if hasattr(cmd, "argv") else cmd, env=env, cwd=scratch)
                for _ in range(repeat)]
        res[name] = {"wall_s": round(statistics.median(w for w, _ in runs), 2),
                     "cpu_s": round(statistics.median(c for _, c in runs), 2)}
        log(f"  {name}: {res[name]['wall_s']:.2f} s wall, {res[name]['cpu_s']:.2f} s CPU (medians of {repeat})")
    return res


# ---------------------------------------------------------------- 5. memory
MEMORY_PROGRAM = """
import json, os, sys
from accelerate import init_empty_weights, load_checkpoint_and_dispatch
from transformers import LlamaConfig, LlamaForCausalLM
from nbtools.bigmodel import quickstart_device_map
from nbtools.bigmodel import PeakRAM, release_freed_memory, tensor_bytes
ckpt = sys.argv[1]
config = LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1024, num_hidden_layers=20,
                     num_attention_heads=8, max_position_embeddings=64)
out = {}
release_freed_memory()
with PeakRAM() as peak:
    with init_empty_weights():
        skeleton = LlamaForCausalLM(config)
out["skeleton_tensor_bytes"] = sum(v for k, v in tensor_bytes(skeleton).items() if k != "meta")
out["skeleton_private_growth"] = peak.private_peak
if not os.path.exists(os.path.join(ckpt, "config.json")):
    model = LlamaForCausalLM(config)
    model.save_pretrained(ckpt, safe_serialization=True)
    del model
out["checkpoint_bytes"] = sum(os.path.getsize(os.path.join(ckpt, f)) for f in os.listdir(ckpt) if f.endswith(".safetensors"))
release_freed_memory()
with PeakRAM() as peak:
    loaded = load_checkpoint_and_dispatch(skeleton, checkpoint=ckpt, device_map=quickstart_device_map("cpu", "disk", 20),
                                          offload_folder=os.path.join(ckpt, "offload"))
out["dispatch_rss_growth"] = peak.rss_peak
out["dispatch_private_growth"] = peak.private_peak
print("MEMORY " + json.dumps(out))
"""


def memory(scratch: Path, log=print) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", MEMORY_PROGRAM, str(scratch / "llama")], capture_output=True, text=True, timeout=900
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("MEMORY ")), None)
    if line is None:
        log(f"  memory: failed\n{proc.stderr[-2000:]}")
        return {"error": proc.stderr[-2000:]}
    res = json.loads(line[len("MEMORY "):])
    log(f"  memory: skeleton {res['skeleton_tensor_bytes']} B of tensors; checkpoint {res['checkpoint_bytes'] / 1e6:.0f} MB")
    return res


# ---------------------------------------------------------------- report
def render(res: dict) -> str:
    n = len(res.get("series", {}).get("runs", [])) or len(res["bare"][0].get("runs_s", [])) or 1
    lines = ["", f"## The quick-start's commands bare vs the notebooks holding its checks (median of {n})", ""]
    lines += ["| notebook | bare (terminal) | series | series / bare | series: command cells | of which beyond bare "
              "(launcher, guardian, output) | series: other cells | series: Jupyter |",
              "|---|---|---|---|---|---|---|---|"]
    bare_total = series_total = 0.0
    for b in res["bare"]:
        s = res.get("series", {}).get("per_notebook_s", {}).get(b["notebook"])
        split = res.get("series", {}).get("split", {}).get(b["notebook"])
        bare_total += b["wall_s"]
        series_total += s or 0
        ratio = f"{s / b['wall_s']:.2f}x" if s else "-"
        parts = (f"{split['commands_s']:.1f} s | {split['commands_s'] - b['wall_s']:+.1f} s | {split['other_cells_s']:.1f} s | "
                 f"{split['jupyter_s']:.1f} s") if split else "- | - | - | -"
        lines.append(f"| {b['notebook']} | {b['wall_s']:.1f} s | {f'{s:.1f} s' if s else '-'} | {ratio} | {parts} |")
    if res.get("series"):
        run_s = res["series"]["run_s"]  # the whole run: the first kernel's start included
        bare_run = statistics.median(res["bare"][0].get("round_totals_s") or [bare_total])
        ratio = run_s / bare_run if bare_run else float("nan")
        paired = res["series"].get("paired_ratios") or []
        lines.append(f"| **sum of notebooks** | {bare_total:.1f} s | {series_total:.1f} s | {series_total / bare_total:.2f}x | | | | |")
        lines.append(f"| **whole path** | {bare_run:.1f} s | {run_s:.1f} s | **{ratio:.2f}x** | | | | |")
        if paired:
            clean = res["series"].get("clean_rounds", [])
            marks = [f"{r:.2f}x" + ("" if i in clean else " (a launch rerun)") for i, r in enumerate(paired)]
            lines += ["", f"Per round (series / bare, the same round): {', '.join(marks)}; median {statistics.median(paired):.2f}x"
                      + (f"; rounds with no launch rerun on either side: median {statistics.median(paired[i] for i in clean):.2f}x"
                         if clean else "") + "."]
        res["series_vs_bare"] = round(ratio, 3)
    if res.get("simulated"):
        here, sim = res["simulated"]["here"], res["simulated"]["simulated"]
        lines += ["", "## The whole series: this machine vs the simulated NPU (`--simulate-npu`)", "",
                  f"| notebook | {res['machine']['device']} | NPU (simulated on CPU) | simulated / here |", "|---|---|---|---|"]
        for name, t in here["per_notebook_s"].items():
            t_sim = sim["per_notebook_s"].get(name)
            lines.append(f"| {name} | {t:.1f} s | {f'{t_sim:.1f} s' if t_sim else '-'} | {f'{t_sim / t:.2f}x' if t_sim and t else '-'} |")
        lines.append(f"| **whole run** | {here['run_s']:.1f} s | {sim['run_s']:.1f} s | **{sim['run_s'] / here['run_s']:.2f}x** |")
        lines += ["", f"Both runs passed: {here['ok'] and sim['ok']}."]
    if res.get("launch"):
        la = res["launch"]
        lines += ["", "## Launch overhead", "",
                  f"| plain `accelerate launch` | `python -m nbtools launch` | overhead (median of {la['pairs']} paired "
                  "differences) |", "|---|---|---|"]
        lines.append(f"| {la['plain_s']:.2f} s | {la['nbtools_s']:.2f} s | {la['overhead_s']:+.2f} s |")
    mem = res.get("memory") or {}
    if "checkpoint_bytes" in mem:
        ck = mem["checkpoint_bytes"]
        lines += ["", "## Memory (the quick-start's Llama, CPU + disk map)", "", "| measure | value |", "|---|---|"]
        lines.append(f"| skeleton tensors (not on meta) | {mem['skeleton_tensor_bytes']} B |")
        lines.append(f"| skeleton private RAM growth | {mem['skeleton_private_growth'] / 1e6:.1f} MB |")
        lines.append(f"| checkpoint | {ck / 1e6:.0f} MB |")
        lines.append(f"| dispatch RSS growth | {mem['dispatch_rss_growth'] / 1e6:.0f} MB ({mem['dispatch_rss_growth'] / ck:.2f}x) |")
        lines.append(f"| dispatch private growth | {mem['dispatch_private_growth'] / 1e6:.0f} MB ({mem['dispatch_private_growth'] / ck:.2f}x) |")
    if res.get("slowest_cells"):
        lines += ["", "## Slowest cells", "", "| notebook | cell | s | source |", "|---|---|---|---|"]
        lines += [f"| {c['notebook']} | {c['cell']} | {c['s']:.1f} | `{c['source']}` |" for c in res["slowest_cells"]]
    lines += ["", "## Targets", ""]
    for name, limit in TARGETS.items():
        value = {"series_vs_bare": res.get("series_vs_bare"), "launch_overhead_s": (res.get("launch") or {}).get("overhead_s"),
                 "skeleton_bytes": mem.get("skeleton_tensor_bytes")}[name]
        verdict = "not measured" if value is None else ("MET" if value <= limit else "MISSED")
        lines.append(f"- {name} <= {limit:g}: {value if value is not None else '-'} -> {verdict}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output", default="bench-out")
    ap.add_argument("--rounds", type=int, default=3, help="bare/series rounds, order alternating (medians are reported)")
    ap.add_argument("--repeat", type=int, default=11, help="launch-overhead pairs, order alternating (the median of "
                    "their differences is reported)")
    ap.add_argument("--skip-series", action="store_true")
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--skip-simulated", action="store_true", help="skip the whole series here vs on the simulated NPU")
    ap.add_argument("--launch-parts", action="store_true", help="only where 01's launch time goes (--repeat runs each): "
                    "imports, a 2-rank launch that only starts and stops, 01's training launched and in one process")
    args = ap.parse_args(argv)
    if args.launch_parts:
        with tempfile.TemporaryDirectory(prefix="nbtools-bench-") as scratch:
            warm_up()
            print(json.dumps(launch_parts(Path(scratch), args.repeat), indent=2))
        return 0
    out = Path(args.output).resolve()
    out.mkdir(parents=True, exist_ok=True)
    info = nbtools.detect()
    res: dict = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_1min": os.getloadavg()[0],
                    "device": info.summary().splitlines()[0], "versions": info.versions},
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    paths = seed_notebooks()
    print(f"notebooks holding the quick-start's checks: {', '.join(p.name for p in paths)}")
    with tempfile.TemporaryDirectory(prefix="nbtools-bench-") as scratch:
        os.environ["NBTOOLS_UNATTENDED"] = "1"  # the bare runs' work folders are private and removed
        warm_up()
        res["bare"], series = rounds(paths, out, max(1, args.rounds), args.skip_series)
        if series:
            res["series"] = series
            res["slowest_cells"] = slowest_cells(Path(series["output"]))
        if not args.skip_simulated:
            res["simulated"] = cpu_vs_simulated(out)
        res["launch"] = launch_overhead(Path(scratch), args.repeat)
        if not args.skip_memory:
            res["memory"] = memory(Path(scratch))
    text = render(res)
    print(text)
    (out / "bench-results.json").write_text(json.dumps(res, indent=2, ensure_ascii=False) + "\n")
    (out / "bench-results.md").write_text(text + "\n")
    print(f"\nwritten: {out / 'bench-results.json'}, {out / 'bench-results.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
