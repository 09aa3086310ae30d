"""`python -m nbtools` and the `nbtools` command: a thin layer over the Python API, so tests, notebooks and terminals share one code path."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path

from .checks import Status
from .errors import LaunchError, LaunchTimeout, NbtoolsError, ParameterError


def _simulate(args) -> None:
    """--simulate-npu: this process and every process it starts see the simulated NPU (device.py)."""
    from .simnpu_env import DEFAULT_CARDS, DEFAULT_SOC, environment, prepare_simnpu

    if not args.simulate_npu:
        if knobs := [f for f, v in (("--npu-cards", args.npu_cards), ("--npu-soc", args.npu_soc), ("--torch-npu", args.torch_npu)) if v is not None]:
            raise ParameterError(f"{' and '.join(knobs)} describe the simulated NPU: add --simulate-npu")
        return
    env = environment(DEFAULT_CARDS if args.npu_cards is None else args.npu_cards, args.npu_soc or DEFAULT_SOC, torch_npu=args.torch_npu)
    os.environ.update(env)
    prepare_simnpu(env)


def _cmd_launch(args) -> int:
    from .guarded import LaunchOptions, accelerate_launch

    _simulate(args)
    try:
        result = accelerate_launch(args.script, *args.args, num_processes=args.num_processes,
                                   mixed_precision=args.mixed_precision, device=args.device, timeout=args.timeout,
                                   options=LaunchOptions(timeout_name="--timeout", offline=not args.online))
    except LaunchError as exc:  # a timeout exits 124, a failure with the launch's own exit code
        print(f"\nnbtools launch: {exc}", file=sys.stderr)
        code = exc.result.returncode if exc.result is not None and exc.result.returncode > 0 else 1
        return 124 if isinstance(exc, LaunchTimeout) else code
    simulated = result.plan.kind == "npu" and result.plan.gloo  # the simulated NPU's hccl is gloo underneath
    print(f"[nbtools] ok in {result.duration_s:.1f} s" + (" on the simulated NPU (not the hardware)" if simulated else ""))
    return 0


def _notebooks_here(args, default_output: Path) -> tuple[list[Path], Path, object]:
    """run and answers: the notebooks named (each checked to exist), the output folder, and the device the kernel
    sees (its interpreter, not this one, is what the notebooks get), said first."""
    from .runner import detect_for_kernel, discover

    notebooks = discover(args.notebooks)
    _simulate(args)
    info = detect_for_kernel(args.kernel)
    print(info.summary())
    return notebooks, Path(args.output) if args.output else default_output, info


def _cmd_run(args) -> int:
    from . import report as report_mod
    from .params import parse_params
    from .runner import NETWORK_ENV, run_notebooks

    params = parse_params(args.param)
    if args.network:  # read by the runner and by the kernels' needs
        os.environ[NETWORK_ENV] = "1"
    notebooks, out, info = _notebooks_here(args, Path("nbtools-output") / time.strftime("%Y%m%d-%H%M%S"))
    print(f"running {len(notebooks)} notebook(s) with kernel {args.kernel!r}; output: {out}")
    rep = run_notebooks(notebooks, out, params, kernel=args.kernel, timeout=args.timeout, keep_work=args.keep_work, info=info)
    paths = report_mod.write_all(rep, out)
    print(report_mod.verdict_table(rep, out))
    for n in rep.notebooks:
        if n.status == Status.FAILED and n.kernel_log:
            print(f"kernel log of {n.path}: {out / n.kernel_log}")
    if args.bundle:
        from .bundle import write_bundle

        paths.append(write_bundle(out))
    print("report: " + ", ".join(str(p) for p in paths))
    print(report_mod.summary_line(rep))
    if rep.stopped_by:
        return 128 + int(getattr(signal, rep.stopped_by))
    return 0 if rep.ok else 1


def _cmd_answers(args) -> int:
    from .answers import run_answers

    notebooks, out, info = _notebooks_here(args, Path("nbtools-output") / "answers")
    print("each answer runs a copy of its lesson changed as the answer says; most answers make a check fail on "
          "purpose, so 'failed' below is often what is expected: the verdicts are compared at the end")
    answers = run_answers(notebooks, out, kernel=args.kernel, timeout=args.timeout, kind=info.kind)
    for a in answers:
        print(f"{'ok' if not a.problems else 'FAILED':>6}  {a.name}: {', '.join(f'{k} {v}' for k, v in a.spec['expect'].items())}")
        for problem in a.problems:
            print(f"          {problem}")
    bad = [a for a in answers if a.problems]
    print(f"{'FAILED' if bad else 'PASSED'}: {len(answers) - len(bad)}/{len(answers)} answers do what their text says; runs in {out}")
    return 1 if bad or not answers else 0


def _cmd_ps(args) -> int:
    """List (and with --kill stop) the live launches; LAUNCH_ID_OR_PID: only these (default: all)."""
    from .npusmi import summary
    from .ps import find, npu_smi_table, render, select, stop

    launches = select(find(), args.which)
    print(render(launches))
    table = npu_smi_table()
    if table is not None:  # one line per chip, then who holds an NPU (as it came, in a layout the parser does not know)
        print("\nnpu-smi info (processes holding an NPU, whoever started them):\n" + (summary(table) if isinstance(table, dict) else table))
    if not args.kill or not launches:
        return 0
    if left := stop(launches):
        print(f"could not stop pid(s) {', '.join(map(str, left))} (another user's? try `kill -9` as that user)")
        return 1
    print(f"stopped {sum(len(g.processes) for g in launches)} process(es) of {len(launches)} launch(es)")
    return 0


def _cmd_check(args) -> int:
    from .lint import check_series
    from .runner import default_notebooks_dir

    folder = Path(args.folder) if args.folder else default_notebooks_dir()
    problems = check_series(folder)
    for p in problems:
        print(p)
    print(f"{len(problems)} problem(s) in {folder}" if problems else f"notebooks in {folder} are clean")
    return 1 if problems else 0


def _cmd_reset(args) -> int:
    from .ps import reset

    reset(Path(args.folder) if args.folder else None, dry_run=args.dry_run, kill=args.kill, find_links=args.find_links)
    return 0


def _cmd_doctor(args) -> int:
    from .doctor import FAIL, diagnose, render

    rows = diagnose()
    print(render(rows))
    return 1 if any(r.status == FAIL for r in rows) else 0


def _cmd_report(args) -> int:
    from .bundle import write_bundle

    zipped = write_bundle(Path(args.run_dir), args.to and Path(args.to))
    print(f"bundle: {zipped} (no path, host name or token of this machine in it; README.md says where to send it)")
    return 0


def _cmd_detect(args) -> int:
    from . import decide
    from .device import detect

    _simulate(args)
    info = detect()
    plan = decide.plan(info, args.num_processes)
    if args.json:
        print(json.dumps({**info.to_dict(), "plan": plan.__dict__}, indent=2))
    else:
        print(info.summary())
        print("plan: " + plan.note)
    return 0


def _simulation_options() -> argparse.ArgumentParser:
    from .simnpu_env import DEFAULT_CARDS, DEFAULT_SOC, SOCS

    sim = argparse.ArgumentParser(add_help=False)
    g = sim.add_argument_group("simulated NPU (proves code paths and wiring on a CPU, never the hardware)")
    g.add_argument("--simulate-npu", action="store_true",
                   help="run on the repository's simulated Ascend NPU (simnpu/): torch_npu, torch.npu, hccl over gloo, npu-smi")
    g.add_argument("--npu-cards", type=int, help=f"simulated cards on the host (default {DEFAULT_CARDS}); "
                   "ASCEND_RT_VISIBLE_DEVICES selects among them as on a real host")
    g.add_argument("--npu-soc", choices=SOCS, help=f"the simulated card (default {DEFAULT_SOC}; "
                   "Ascend310P3 has no bf16)")
    g.add_argument("--torch-npu", choices=("2.9.0.post2", "2.14.0"), help="the torch_npu release whose names and rules it presents (simnpu/api/; default 2.9.0.post2)")
    return sim


def _notebook_run_options(p: argparse.ArgumentParser, default_output: str) -> None:
    from .run_results import CELL_TIMEOUT_S, DEFAULT_KERNEL

    p.add_argument("notebooks", nargs="*", help="notebook files or folders (default: notebooks/)")
    p.add_argument("--output", help=f"output dir (default: {default_output})")
    p.add_argument("--timeout", type=float, default=CELL_TIMEOUT_S, help=f"per-cell timeout in seconds (default {CELL_TIMEOUT_S})")
    p.add_argument("--kernel", default=DEFAULT_KERNEL, help="Jupyter kernel name, as `jupyter kernelspec list` shows it "
                   "(ModelArts names kernels per engine); the device is probed with that kernel's own interpreter")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m nbtools", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    sim = _simulation_options()

    r = sub.add_parser("run", parents=[sim], help="execute notebooks with papermill and write report.json/report.md/junit.xml")
    _notebook_run_options(r, "nbtools-output/<timestamp>")
    r.add_argument("-p", "--param", action="append", metavar="NAME=VALUE", help="parameter for every notebook declaring it")
    r.add_argument("--keep-work", action="store_true", help="keep the notebooks' work dirs")
    r.add_argument("--bundle", action="store_true", help="also zip the report to send back (as `report --bundle`)")
    r.add_argument("--network", action="store_true",
                   help="this machine reaches GitHub and the Hub: checks tagged needs:network are expected to run")

    from . import decide  # the one default count and precision list (decide.py)
    from .params import DEFAULT_TIMEOUT_S

    la = sub.add_parser("launch", parents=[sim], help="accelerate launch a script with the right flags for this machine")
    la.add_argument("--num-processes", type=int, help=f"default: {decide.DEFAULT_PROCESSES}")
    la.add_argument("--mixed-precision", default="no", choices=decide.MIXED_PRECISIONS)
    la.add_argument("--device", default="auto", help="auto | npu | cuda | cpu")
    la.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds before the whole launch is stopped")
    la.add_argument("--online", action="store_true", help="let Hugging Face reach the network")
    la.add_argument("script")
    la.add_argument("args", nargs=argparse.REMAINDER)

    an = sub.add_parser("answers", parents=[sim], help="apply every exercise answer that is code to its lesson, run it, "
                        "and check that the checks say what the answer says")
    _notebook_run_options(an, "nbtools-output/answers")

    c = sub.add_parser("check", help="hygiene of the committed notebooks (clean, tagged, no shell escapes)")
    c.add_argument("folder", nargs="?")

    rs = sub.add_parser("reset", help="between two workshop groups: the notebooks back as committed, nbtools' launches "
                        "stopped, the processes holding a card listed, notebooks/work/ removed, the Accelerate "
                        "requirements.txt asks for put back; says what it did")
    rs.add_argument("folder", nargs="?", help="the notebooks' folder (default: notebooks/)")
    rs.add_argument("--dry-run", action="store_true", help="say what it would do, do nothing")
    rs.add_argument("--kill", action="store_true", help="also stop every process holding a card (npu-smi's table)")
    rs.add_argument("--find-links", metavar="WHEELHOUSE", help="reinstall Accelerate from this folder, with no index")

    sub.add_parser("doctor", help="check Python/torch/torch_npu/CANN/devices/accelerate against the quick-start's versions")

    _inspect_commands(sub, sim)
    return p


def _inspect_commands(sub, sim: argparse.ArgumentParser) -> None:
    """ps, detect and report: what runs, what this machine is, what a run found."""
    ps = sub.add_parser("ps", help="list launches nbtools started that are still running (--kill stops them)")
    ps.add_argument("--kill", action="store_true", help="stop every listed launch with all its processes")
    ps.add_argument("which", nargs="*", metavar="LAUNCH_ID_OR_PID",
                    help="only these launches: an id, or a pid of one of its processes or of its starter (default: all)")

    de = sub.add_parser("detect", parents=[sim], help="print what this machine is and how a real N-process group starts here")
    de.add_argument("--json", action="store_true")
    de.add_argument("--num-processes", type=int)

    rp = sub.add_parser("report", help="--bundle zips a run's report.json, result.json, junit.xml and "
                        "the environment (npu-smi, packages, accelerate env), scrubbed, to send back")
    rp.add_argument("run_dir", help="the --output folder of a `python -m nbtools run`")
    rp.add_argument("--bundle", action="store_true", required=True, help="the only action so far")
    rp.add_argument("--to", help="the zip's path (default: RUN_DIR/nbtools-bundle.zip)")


def main(argv: list[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):  # whatever a notebook said, even where the terminal's encoding cannot
        with contextlib.suppress(AttributeError, ValueError):  # (LANG=C, GBK)
            stream.reconfigure(errors="backslashreplace")
    args = build_parser().parse_args(argv)
    try:
        return globals()[f"_cmd_{args.command}"](args)  # command NAME runs _cmd_NAME(args)
    except NbtoolsError as exc:
        print(f"nbtools {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("nbtools: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
