"""Teardown aborts: how often a 2-rank launch dies at exit, per route, measured by launching it N times.

    python bench/teardown.py [--n 100] [--routes cpu,simulated-npu] [--scripts gather_npu.py,eval_npu.py] [--output DIR]

A rank that finished its work can still die while the process exits, with torch's C++ runtime saying
"terminate called without an active exception" (SIGABRT). nbtools' launcher reruns such a launch, at most
twice, saying so in the cell, on routes whose collectives run on torch's gloo: the CPU route and the
simulated NPU (its hccl is gloo underneath); a real NPU's or GPU's abort fails at once.

This script launches the first evaluation script of 02_distributed_eval (`gather_npu.py`) and of
02b_distributed_eval_right (`eval_npu.py`), as their cells write and launch them (the notebooks are the one
copy), ``--n`` times each, through the same launcher as a ``%launch`` cell, on this machine's CPU and on the
simulated NPU (``--simulate-npu``), and prints per route and script: launches, aborts (each one a rerun the
launcher said), the abort rate, and launches that still failed. Results: DIR/teardown-results.json.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

import nbtools
from nbtools import decide, magics, simnpu_env
from nbtools.decide import launch_spec
from nbtools.guarded import ABORT_RERUN_SAID, launch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import NOTEBOOKS, defaults, steps  # noqa: E402  (bench/bench.py: the notebooks' command cells)

SCRIPTS = {"02_distributed_eval.ipynb": "gather_npu.py", "02b_distributed_eval_right.ipynb": "eval_npu.py"}
ROUTES = ("cpu", "simulated-npu")


def first_launch(path: Path, script: str, namespace: dict, folder: Path) -> str:
    """Write the notebook's ``script`` into ``folder``; the text of the first ``%launch`` that runs it."""
    for kind, arg, body in steps(nbformat.read(path, as_version=4), namespace):
        if kind == "write" and arg == script:
            (folder / script).write_text(body + "\n")
        if kind == "launch" and f" {script}" in f" {body}":
            return magics.expand_fields(body, namespace)
    raise SystemExit(f"{path.name} has no %launch of {script}")


def measure(path: Path, script: str, n: int, log=print) -> dict:
    """``n`` launches of the notebook's ``script`` with the launcher's rules; what the launcher said."""
    params, origin = defaults(path), Path.cwd()
    with tempfile.TemporaryDirectory(prefix="nbtools-teardown-") as work:
        with contextlib.redirect_stdout(io.StringIO()):
            session = nbtools.setup(num_processes=params.get("num_processes", 2), work_dir=work)
        folder = Path(session.work)
        text = first_launch(path, script, dict(params, S=session), folder)
        call = decide.parse_launch(text)  # the count not written: the session's (launch_spec)
        spec = launch_spec(call, info=session.info, timeout=600, cwd=folder)
        aborts, failed, start = 0, 0, time.monotonic()
        for i in range(n):
            said = io.StringIO()
            with contextlib.redirect_stdout(said):
                result = launch(spec, check=False)
            aborts += said.getvalue().count(ABORT_RERUN_SAID)
            failed += result.returncode != 0
            if (i + 1) % 10 == 0:
                log(f"    {path.stem} {script}: {i + 1}/{n}, {aborts} abort(s), {failed} failed")
        with contextlib.redirect_stdout(io.StringIO()):
            session.close()
        os.chdir(origin)
    return {"notebook": path.name, "script": script, "command": spec.shown(None), "launches": n, "aborts": aborts,
            "abort_rate": round(aborts / (n + aborts), 4), "failed": failed, "wall_s": round(time.monotonic() - start, 1)}


def route(n: int, scripts: list[str], log=print) -> dict:
    info = nbtools.detect()
    label = f"{info.kind}{' (simulated)' if info.simulated else ''}"
    log(f"  route: {label}")
    return {"route": label, "versions": info.versions,
            "scripts": [measure(NOTEBOOKS / nb, script, n, log) for nb, script in SCRIPTS.items() if script in scripts]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100, help="launches per script and route")
    ap.add_argument("--routes", default="cpu,simulated-npu", help="comma-separated: cpu, simulated-npu")
    ap.add_argument("--scripts", default=",".join(SCRIPTS.values()), help="comma-separated: " + ", ".join(SCRIPTS.values()))
    ap.add_argument("--output", default="bench-out")
    ap.add_argument("--route", choices=ROUTES, help=argparse.SUPPRESS)  # one route, in a child
    args = ap.parse_args(argv)
    scripts = args.scripts.split(",")
    if args.route:  # the child: this process sees one route only (detect() is per process)
        print(json.dumps(route(args.n, scripts, log=lambda s: print(s, file=sys.stderr, flush=True))))
        return 0
    routes = args.routes.split(",")
    if not set(routes) <= set(ROUTES) or not set(scripts) <= set(SCRIPTS.values()):
        ap.error(f"--routes takes {', '.join(ROUTES)}; --scripts takes {', '.join(SCRIPTS.values())}")
    results = []
    for name in routes:
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
        if name == "simulated-npu":
            env.update(simnpu_env.environment())
        proc = subprocess.run([sys.executable, __file__, "--n", str(args.n), "--route", name, "--scripts", args.scripts], env=env,
                              stdout=subprocess.PIPE, text=True, check=True)
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    (out / "teardown-results.json").write_text(json.dumps(results, indent=2))
    print("\n| route | script | launches | aborts (reruns) | abort rate | still failed | wall |\n|---|---|---|---|---|---|---|")
    for r in results:
        for s in r["scripts"]:
            print(f"| {r['route']} | {s['script']} | {s['launches']} | {s['aborts']} | {s['abort_rate']:.1%} | "
                  f"{s['failed']} | {s['wall_s']:.0f} s |")
    print(f"\ntorch {results[0]['versions'].get('torch')}, accelerate {results[0]['versions'].get('accelerate')}; "
          f"results: {out / 'teardown-results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
