"""Benchmark: the notebook series 00-03 beside the seed's own commands, on the same machine.

    python bench/bench_series.py [--output DIR] [--skip-series] [--repeat N] [--profile]
    python bench/bench_series.py --profile-from DIR   # where a past `nbtools run` spent its time

Run from the repository root, outside CI (a full run takes several minutes). In one run:

1. the seed's 12 commands (+ its 3 setup blocks), adapted to this machine as the notebooks
   adapt them (bench/seed_commands.py), each run bare with ``bash -c`` in a scratch dir;
2. ``python -m nbtools run`` on the notebooks that cover the seed (00-03);
3. both side by side per notebook, with the ratio series / bare, in bench-results.json;
4. memory and load speed for the seed's Llama (bench/memory.py, fresh processes);
5. the targets, PASS/MISS; with --profile, per-cell times from the executed notebooks.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import memory  # noqa: E402
import seed_commands  # noqa: E402

SERIES = list(seed_commands.NOTEBOOKS)  # 00_environment ... 03_big_model_inference
ERROR_MARKERS = ("Traceback (most recent call last)", "[ERROR]", "ERR99999")
TARGETS = {
    "series_vs_bare": 1.0,  # series 00-03 wall time <= 1.0x the bare seed commands' wall time
    "env_notebook_s": 15.0,  # 00_environment < 15 s
    "skeleton_bytes": 1e6,  # init_empty_weights skeleton allocates < 1 MB
    "dispatch_rss_x": 1.25,  # peak RSS growth during load_checkpoint_and_dispatch <= 1.25x checkpoint
}


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _load() -> float:
    return round(os.getloadavg()[0], 2)


# ---------------------------------------------------------------- 1. the seed's commands, bare

def bare_env(info) -> dict:
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")  # this venv's python/pip/accelerate
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})  # as the notebooks: nothing downloaded
    env.pop("NBTOOLS_DEVICE_PROBE", None)
    if info.plan(2).device != "cpu":
        env.pop("ACCELERATE_USE_CPU", None)
    return env


def run_bare(info, scratch: Path, timeout: float, log=print) -> dict:
    """Every seed command once, in order, in ``scratch`` (its working dir)."""
    scratch.mkdir(parents=True, exist_ok=True)
    env = bare_env(info)
    stored: dict[str, str] = {}
    rows = []
    load0, t_all = _load(), time.perf_counter()
    cpu_all = _children_cpu()
    for cmd in seed_commands.commands(info):
        row = {"id": cmd.id, "notebook": cmd.notebook, "adapted": cmd.adapted}
        if cmd.skip:
            row.update(status="skipped", reason=cmd.skip, seconds=0.0, cpu_s=0.0)
            rows.append(row)
            log(f"  {cmd.id:26} skipped: {cmd.skip}")
            continue
        text = seed_commands.fill(cmd.text, stored)
        row["command"] = text
        cpu0, t0 = _children_cpu(), time.perf_counter()
        try:
            proc = subprocess.run(["bash", "-c", text], cwd=scratch, env=env, capture_output=True, text=True,
                                  timeout=timeout, stdin=subprocess.DEVNULL)
            rc, output = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as exc:
            rc, output = -9, f"timed out after {timeout} s\n{exc.stdout or ''}"
        seconds, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
        problems = []
        if rc != 0:
            problems.append(f"exit code {rc}")
        problems += [f"error marker {m!r}" for m in ERROR_MARKERS if m in output]
        if cmd.expected and not problems:
            from nbtools import match

            m = match(cmd.expected, proc.stdout)
            if not m:
                problems.append("output differs from the seed's expected block: " + m.report().splitlines()[-1])
        if cmd.store and not problems:
            stored[cmd.store] = proc.stdout.strip().splitlines()[-1]
        row.update(status="failed" if problems else "passed", seconds=round(seconds, 3), cpu_s=round(cpu, 3),
                   problems=problems, output_tail="\n".join(output.strip().splitlines()[-8:]))
        rows.append(row)
        log(f"  {cmd.id:26} {seconds:7.2f} s  {row['status']}" + (f": {'; '.join(problems)}" if problems else ""))
    return {
        "commands": rows,
        "total_s": round(time.perf_counter() - t_all, 3),
        "cpu_s": round(_children_cpu() - cpu_all, 3),
        "load_before": load0,
        "load_after": _load(),
        "ok": all(r["status"] != "failed" for r in rows),
        "checkpoint": stored.get("dispatch_ckpt"),
    }


# ---------------------------------------------------------------- 2. the series

def series_notebooks(folder: Path) -> list[Path]:
    return [folder / f"{name}.ipynb" for name in SERIES]


def run_series(out: Path, timeout: float, log=print) -> dict:
    notebooks = series_notebooks(ROOT / "notebooks")
    argv = [sys.executable, "-m", "nbtools", "run", *map(str, notebooks), "--output", str(out)]
    log(f"  $ {' '.join(argv[1:])}")
    load0, cpu0, t0 = _load(), _children_cpu(), time.perf_counter()
    with open(out.with_suffix(".log"), "w") as fh:
        try:
            rc = subprocess.run(argv, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout,
                                stdin=subprocess.DEVNULL).returncode
        except subprocess.TimeoutExpired:
            rc = -9
    wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    res = {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "rc": rc, "output": str(out),
           "log": str(out.with_suffix(".log")), "load_before": load0, "load_after": _load(), "notebooks": []}
    report = out / "report.json"
    if report.exists():
        rep = json.loads(report.read_text())
        res["notebooks"] = [
            {"notebook": Path(n["path"]).stem, "status": n.get("status"), "duration_s": n.get("duration_s")}
            for n in rep.get("notebooks", [])
        ]
        res["run_duration_s"] = rep.get("duration_s")
        res["checks"] = {c["id"]: c.get("status") for c in rep.get("checks", [])}
    for n in res["notebooks"]:
        log(f"  {n['notebook']:26} {n['duration_s']:7.2f} s  {n['status']}")
    log(f"  nbtools run: exit {rc}, {wall:.1f} s wall")
    return res


# ---------------------------------------------------------------- 5. profile

_WHAT = (
    ("accelerate_launch", "accelerate launch"),
    ("nbtools.run(", "subprocess"),
    ("load_checkpoint_and_dispatch", "dispatch"),
    (".generate(", "generate"),
    ("from_pretrained", "from_pretrained"),
    ("save_pretrained", "build+save checkpoint"),
    ("Accelerator(", "in-kernel Accelerator"),
    ("init_empty_weights", "init_empty_weights"),
    ("%%writefile", "writefile"),
)
_HEAVY = ("torch", "accelerate", "transformers")


def _kind_of(src: str, imported: set) -> str:
    """What a cell does (by the calls it makes), and which heavy modules it imports first in this kernel."""
    import re

    what = [label for needle, label in _WHAT if needle in src]
    first = []
    for mod in _HEAVY:
        if mod not in imported and re.search(rf"^\s*(import|from)\s+{mod}\b", src, re.M):
            imported.add(mod)
            first.append(mod)
    if first:
        what.append("1st import " + "+".join(first))
    return ", ".join(what)


def profile_notebooks(folder: Path) -> dict:
    """Per notebook and per cell, from the executed notebooks' papermill metadata."""
    import nbformat

    notebooks, cells = [], []
    for path in sorted(folder.glob("[0-9][0-9]*_*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        total = (nb.metadata.get("papermill") or {}).get("duration")
        cell_sum = 0.0
        imported: set = set()
        for i, c in enumerate(nb.cells):
            d = (c.metadata.get("papermill") or {}).get("duration")
            if c.cell_type != "code" or d is None:
                continue
            cell_sum += d
            tags = [t for t in c.metadata.get("tags", []) if t != "injected-parameters"]
            feeds = next(
                (t for c2 in nb.cells[i:] for t in c2.metadata.get("tags", []) if t.startswith("check:")), ""
            )
            first = next((ln.strip() for ln in c.source.splitlines() if ln.strip() and not ln.strip().startswith("#")), "")
            cells.append({
                "notebook": path.stem, "cell": i, "seconds": round(d, 3), "tags": tags,
                "feeds": feeds.removeprefix("check:"), "kind": _kind_of(c.source, imported), "first_line": first[:90],
            })
        notebooks.append({
            "notebook": path.stem, "papermill_s": round(total, 2) if total else None,
            "cells_s": round(cell_sum, 2),
            "outside_cells_s": round(total - cell_sum, 2) if total else None,  # kernel start/stop, papermill
        })
    return {"notebooks": notebooks, "cells": cells}


def merge_profiles(profiles: list[dict]) -> dict:
    """Median per cell and per notebook over repeats."""
    if len(profiles) == 1:
        return profiles[0]
    by_cell: dict = {}
    for p in profiles:
        for c in p["cells"]:
            by_cell.setdefault((c["notebook"], c["cell"]), []).append(c)
    cells = []
    for group in by_cell.values():
        c = dict(group[0])
        c["seconds"] = round(statistics.median(g["seconds"] for g in group), 3)
        cells.append(c)
    nbs = []
    for name in {n["notebook"] for p in profiles for n in p["notebooks"]}:
        rows = [n for p in profiles for n in p["notebooks"] if n["notebook"] == name]
        nbs.append({k: (rows[0][k] if k == "notebook" else round(statistics.median(r[k] or 0 for r in rows), 2))
                    for k in rows[0]})
    return {"notebooks": sorted(nbs, key=lambda n: n["notebook"]), "cells": cells}


def render_profile(prof: dict, top: int = 10) -> list[str]:
    out = ["where the series' time goes (papermill cell durations):",
           f"  {'notebook':26}{'notebook':>10}{'in cells':>10}{'outside':>9}"]
    for n in prof["notebooks"]:
        out.append(f"  {n['notebook']:26}{n['papermill_s'] or 0:9.1f}s{n['cells_s']:9.1f}s{n['outside_cells_s'] or 0:8.1f}s")
    total = sum(c["seconds"] for c in prof["cells"]) or 1.0
    ranked = sorted(prof["cells"], key=lambda c: -c["seconds"])[:top]
    out += [f"the {len(ranked)} slowest cells ({sum(c['seconds'] for c in ranked) / total:.0%} of all cell time):",
            f"  {'#':>2} {'notebook':24}{'cell':>5}{'seconds':>9}  {'role':26} {'what':44} first line"]
    for k, c in enumerate(ranked, 1):
        role = ("tag " + ",".join(c["tags"])) if c["tags"] else (f"feeds {c['feeds']}" if c["feeds"] else "")
        out.append(f"  {k:>2} {c['notebook']:24}{c['cell']:>5}{c['seconds']:8.2f}s  {role:26} {c['kind']:44} {c['first_line'][:60]}")
    return out


# ---------------------------------------------------------------- comparison, targets, output

def _med(values):
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 3) if values else None


def compare(bare_runs: list[dict], series_runs: list[dict]) -> dict:
    rows = []
    for name in SERIES:
        bare = _med([sum(c["seconds"] for c in r["commands"] if c["notebook"] == name) for r in bare_runs])
        bare_cpu = _med([sum(c["cpu_s"] for c in r["commands"] if c["notebook"] == name) for r in bare_runs])
        ids = [c["id"] for c in bare_runs[0]["commands"] if c["notebook"] == name]
        ser = _med([next((n["duration_s"] for n in r["notebooks"] if n["notebook"] == name), None) for r in series_runs])
        rows.append({"notebook": name, "seed_commands": ids, "bare_s": bare, "bare_cpu_s": bare_cpu, "series_s": ser,
                     "ratio": round(ser / bare, 2) if ser and bare else None})
    bare_total = _med([r["total_s"] for r in bare_runs])
    bare_cpu = _med([r["cpu_s"] for r in bare_runs])
    ser_wall = _med([r["wall_s"] for r in series_runs]) if series_runs else None
    ser_sum = _med([sum(n["duration_s"] or 0 for n in r["notebooks"]) for r in series_runs]) if series_runs else None
    ser_cpu = _med([r["cpu_s"] for r in series_runs]) if series_runs else None
    return {
        "notebooks": rows,
        "bare_total_s": bare_total,
        "bare_cpu_s": bare_cpu,
        "series_wall_s": ser_wall,
        "series_notebooks_sum_s": ser_sum,
        "series_cpu_s": ser_cpu,
        "ratio_wall": round(ser_wall / bare_total, 2) if ser_wall and bare_total else None,
        "ratio_cpu": round(ser_cpu / bare_cpu, 2) if ser_cpu and bare_cpu else None,
    }


def render_comparison(cmp: dict, bare_runs: list[dict]) -> list[str]:
    n = len(bare_runs)
    med = "median of %d runs" % n if n > 1 else "one run"
    out = [f"seed commands bare vs notebook series ({med}; wall seconds, CPU seconds of all child processes):",
           f"  {'notebook':26}{'bare':>9}{'series':>9}{'series/bare':>12}   seed commands"]
    for r in cmp["notebooks"]:
        ratio = f"{r['ratio']:.2f}x" if r["ratio"] else "-"
        ser = f"{r['series_s']:.1f}s" if r["series_s"] is not None else "-"
        out.append(f"  {r['notebook']:26}{r['bare_s']:8.1f}s{ser:>9}{ratio:>12}   {', '.join(r['seed_commands'])}")
    if cmp["series_wall_s"]:
        out += [
            f"  {'sum of notebooks':26}{sum(r['bare_s'] for r in cmp['notebooks']):8.1f}s{cmp['series_notebooks_sum_s']:8.1f}s"
            f"{cmp['series_notebooks_sum_s'] / sum(r['bare_s'] for r in cmp['notebooks']):11.2f}x",
            f"  {'total wall':26}{cmp['bare_total_s']:8.1f}s{cmp['series_wall_s']:8.1f}s{cmp['ratio_wall']:11.2f}x"
            "   (series: the whole `python -m nbtools run`)",
            f"  {'total CPU (user+sys)':26}{cmp['bare_cpu_s']:8.1f}s{cmp['series_cpu_s']:8.1f}s{cmp['ratio_cpu']:11.2f}x"
            "   (less sensitive to other load than wall time)",
        ]
    else:
        out.append(f"  {'total wall':26}{cmp['bare_total_s']:8.1f}s   (series skipped)")
    out.append("  per seed command (bare):")
    for i, c in enumerate(bare_runs[0]["commands"]):
        secs = _med([r["commands"][i]["seconds"] for r in bare_runs])
        what = c["status"] + (f" ({c['reason']})" if c["status"] == "skipped" else "")
        out.append(f"    {c['id']:26}{secs:7.2f}s  {c['notebook']:24} {what}")
    return out


def targets(cmp: dict, mem: dict | None) -> list[dict]:
    rows = []

    def add(name, value, limit, shown, ok):
        rows.append({"target": name, "value": value, "limit": limit, "shown": shown,
                     "result": "n/a" if value is None else ("PASS" if ok else "MISS")})

    r = cmp.get("ratio_wall")
    add("series 00-03 wall <= 1.0x bare seed commands", r, TARGETS["series_vs_bare"],
        f"{r:.2f}x ({cmp['series_wall_s']:.1f} s vs {cmp['bare_total_s']:.1f} s)" if r else "series not run",
        r is not None and r <= TARGETS["series_vs_bare"])
    env_s = next((n["series_s"] for n in cmp["notebooks"] if n["notebook"] == "00_environment"), None)
    add("00_environment < 15 s", env_s, TARGETS["env_notebook_s"], f"{env_s:.1f} s" if env_s else "series not run",
        env_s is not None and env_s < TARGETS["env_notebook_s"])
    sk = (mem or {}).get("skeleton", {})
    if sk and "error" not in sk:
        b = sk["storage_bytes"] + sk["tracemalloc_peak_bytes"]
        add("init_empty_weights skeleton allocates < 1 MB", b, TARGETS["skeleton_bytes"],
            f"{b / 1e6:.2f} MB (tensor storage {sk['storage_bytes']} B + python heap peak "
            f"{sk['tracemalloc_peak_bytes'] / 1e3:.0f} kB)", b < TARGETS["skeleton_bytes"])
    else:
        add("init_empty_weights skeleton allocates < 1 MB", None, TARGETS["skeleton_bytes"], "not measured", False)
    d = (mem or {}).get("dispatch_notebook", {})
    if d and "error" not in d:
        x = d["peak_rss_growth_bytes"] / d["checkpoint_bytes"]
        add("dispatch peak RSS growth <= 1.25x checkpoint", round(x, 3), TARGETS["dispatch_rss_x"],
            f"{x:.2f}x (+{d['peak_rss_growth_bytes'] / 1e6:.0f} MB for {d['checkpoint_bytes'] / 1e6:.0f} MB, "
            f"{d['device_map']})", x <= TARGETS["dispatch_rss_x"])
    else:
        add("dispatch peak RSS growth <= 1.25x checkpoint", None, TARGETS["dispatch_rss_x"], "not measured", False)
    return rows


def machine(info) -> dict:
    return {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "device": info.kind,
        "device_count": info.count,
        "versions": info.versions,
        "plan_2": info.plan(2).note,
        "loadavg_start": os.getloadavg(),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output", type=Path, help="where bench-results.json and the series' outputs go (default: a temp dir)")
    p.add_argument("--skip-series", action="store_true", help="only the bare seed commands (and memory)")
    p.add_argument("--skip-memory", action="store_true", help="leave out the memory / load-speed section")
    p.add_argument("--repeat", type=int, default=1, help="run bare + series N times, alternating; report medians")
    p.add_argument("--profile", action="store_true", help="print per-notebook and the 10 slowest cells")
    p.add_argument("--profile-from", type=Path, metavar="DIR",
                   help="only profile the executed notebooks in DIR (an `nbtools run --output` dir) and exit")
    p.add_argument("--timeout", type=float, default=900, help="seconds per bare command / per series run")
    a = p.parse_args(argv)

    if a.profile_from:
        print("\n".join(render_profile(profile_notebooks(a.profile_from))))
        return 0
    if a.repeat < 1:
        p.error("--repeat must be >= 1")

    import nbtools

    out = (a.output or Path(tempfile.mkdtemp(prefix="bench-series-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    scratch_root = Path(tempfile.mkdtemp(prefix="bench-scratch-"))
    info = nbtools.detect()
    print(info.summary())
    print(f"2-process launches: {info.plan(2).note}; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPU(s)")
    results: dict = {"machine": machine(info), "repeat": a.repeat, "bare": [], "series": []}
    profiles = []
    t_start = time.perf_counter()
    try:
        for i in range(a.repeat):
            tag = f" (run {i + 1}/{a.repeat})" if a.repeat > 1 else ""
            print(f"\n== 1. the seed's commands, bare{tag}")
            scratch = scratch_root / f"bare-{i + 1}"
            results["bare"].append(run_bare(info, scratch, a.timeout))
            if i + 1 < a.repeat:  # keep the last run's checkpoint for the memory section
                shutil.rmtree(scratch, ignore_errors=True)
            if not a.skip_series:
                print(f"\n== 2. the series (python -m nbtools run, notebooks 00-03){tag}")
                s = run_series(out / f"series-{i + 1}", a.repeat * a.timeout)
                results["series"].append(s)
                profiles.append(profile_notebooks(out / f"series-{i + 1}"))

        cmp = compare(results["bare"], results["series"])
        results["comparison"] = cmp
        if profiles:
            results["profile"] = merge_profiles(profiles)
        mem = None
        if not a.skip_memory:
            print("\n== 4. memory and load speed of the seed's Llama (each in a fresh process)")
            ckpt = results["bare"][-1].get("checkpoint")
            mem = memory.measure_all(Path(ckpt) if ckpt else None, scratch_root / "memory")
            results["memory"] = mem
        results["targets"] = targets(cmp, mem)
    finally:
        shutil.rmtree(scratch_root, ignore_errors=True)
    results["machine"]["loadavg_end"] = os.getloadavg()
    results["bench_wall_s"] = round(time.perf_counter() - t_start, 1)

    print("\n== 3. side by side")
    print("\n".join(render_comparison(results["comparison"], results["bare"])))
    if mem:
        print("\n== 4. memory and load speed")
        print("\n".join(memory.render(mem)))
    if a.profile and profiles:
        print("\n== profile")
        print("\n".join(render_profile(results["profile"])))
    print("\n== targets (this machine; wall times depend on its load: "
          f"load average {results['machine']['loadavg_start'][0]:.1f} -> {results['machine']['loadavg_end'][0]:.1f}"
          f" on {os.cpu_count()} CPU(s))")
    for t in results["targets"]:
        print(f"  {t['result']:>4}  {t['target']:48} {t['shown']}")
    problems = [f"bare {c['id']}: {'; '.join(c['problems'])}" for r in results["bare"] for c in r["commands"]
                if c["status"] == "failed"]
    problems += [f"series run {i + 1}: nbtools run exited {s['rc']} (log: {s['log']})"
                 for i, s in enumerate(results["series"]) if s["rc"] != 0]
    for k in ("skeleton", "normal_init", "read_raw", "load_file", "dispatch_notebook", "dispatch_cpu"):
        if mem and "error" in mem.get(k, {}):
            problems.append(f"memory {k}: {mem[k]['error'].splitlines()[0]}")
    results["problems"] = problems
    if problems:
        print("\nPROBLEMS (figures next to them are not comparable):")
        for pr in problems:
            print("  " + pr)
    path = out / "bench-results.json"
    path.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"\nresults: {path}  ({results['bench_wall_s']:.0f} s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
