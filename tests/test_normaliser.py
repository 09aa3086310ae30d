"""One normaliser for every launch (decide.launch_spec): a %launch cell, a launch built in code, a machine of 06,
the CLI and the bench's nbtools side are decided there; each rule it applies has one source (device.py), and a
change of that source reaches every entry point."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

import nbtools
from nbtools import ParameterError, __main__, decide, guarded, machines, magics, session
from nbtools.device import from_probe

ROOT = Path(__file__).resolve().parent.parent
NPU2 = {"python": "3.12.1", "torch": "2.9.0", "torch_npu": "2.9.0.post2", "cann": "9.1.0", "npu_available": True,
        "npu_count": 2, "npu_names": ["Ascend910B4"] * 2}
SIM8 = dict(NPU2, torch_npu="2.9.0.post2+simulated", npu_simulated=True, npu_count=8, npu_names=["Ascend910B4"] * 8)
MACHINE = "accelerate launch --num_machines 2 --machine_rank 0 --main_process_ip 127.0.0.1 --main_process_port 29500 t.py"


def info(probe, environ=None):
    return from_probe(probe, environ=environ or {})


@pytest.fixture
def in_session(tmp_path, monkeypatch):
    """An open session on a simulated 8-card host (no process started): what the normaliser fills from."""
    def open_(probe=SIM8, n=2, environ=None):
        host = info(probe, environ)
        s = session.Session(host, decide.plan(host, n), "auto", n, 600, tmp_path)
        monkeypatch.setattr(decide, "OPEN", s)
        return s
    monkeypatch.chdir(tmp_path)
    return open_


def spec_of(text, **kw):
    return decide.launch_spec(decide.parse_launch(text), **kw)


# ---------------------------------------------------------------- the three launches of issue 52


def test_a_built_launch_with_a_count_and_cpu_runs_as_accelerate_accepts(tmp_path):
    built = decide.LaunchCall.of("t.py", extra_flags=("--num_processes", "4", "--cpu"))
    spec = decide.launch_spec(built, info=info(NPU2), cwd=tmp_path)
    argv = spec.argv(None, shown=True)
    assert spec.kind == "cpu" and spec.num_processes == 4
    assert argv.count("--num_processes") == 1 and argv[argv.index("--num_processes") + 1] == "4"
    assert "--cpu" not in argv and argv.count("--multi_gpu") == 1 and dict(spec.env)["ACCELERATE_USE_CPU"] == "1"
    assert "照写的 --cpu：在 CPU 上运行" in spec.why


@pytest.mark.parametrize("make, said", [
    (lambda: decide.LaunchCall.of("t.py", num_processes=2, extra_flags=("--num_processes", "4")), "given twice"),
    (lambda: decide.parse_launch("accelerate launch --num_processes 2 --num_processes 4 t.py"), "written twice"),
    (lambda: decide.parse_launch("accelerate launch --cpu --multi_gpu t.py"), "refused by Accelerate"),
    (lambda: decide.LaunchCall.of("t.py", extra_flags=("--cpu", "--multi_gpu")), "refused by Accelerate"),
    (lambda: decide.LaunchCall.of("t.py", extra_flags=("x.py",)), "no flag of accelerate launch"),
])
def test_conflicting_flags_are_refused_with_a_sentence(make, said):
    with pytest.raises(ParameterError, match=said):
        make()


@pytest.mark.parametrize("precision, said", [("fp16", "not supported on cpu"), ("fp8", "not known")])
def test_a_machine_of_06_with_a_bad_precision_is_refused(precision, said, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ParameterError, match=said):
        machines.stand_in(MACHINE.replace("t.py", f"--mixed_precision {precision} t.py"))


def test_an_unnumbered_launch_names_the_count_and_the_cards(in_session, tmp_path):
    in_session()
    spec = spec_of("accelerate launch t.py", cwd=tmp_path)
    assert "没写 --num_processes：用 2 个进程（会话的 num_processes），卡 0,1" in spec.why
    assert "没写 --mixed_precision：用 no" in spec.why
    in_session(environ={"ASCEND_RT_VISIBLE_DEVICES": "4,5,6,7"}, n=3)  # a shared host: the session's own cards
    spec = spec_of("accelerate launch t.py", cwd=tmp_path)
    assert "用 3 个进程（会话的 num_processes），卡 4,5,6" in spec.why and "ASCEND_RT_VISIBLE_DEVICES=4,5,6 " in spec.shown(1)


# ---------------------------------------------------------------- one source per rule, every entry point follows


class Decided(Exception):
    """Raised by a stand-in for guarded.launch: the spec it was given, no process started."""

    def __init__(self, spec):
        super().__init__()
        self.spec = spec


def entry_points(tmp_path, monkeypatch, written=""):
    """The launch each entry point decides for `accelerate launch {written} t.py`, as its shown command (the CLI, a
    launch built in code and %launch: the spec `launch` receives; 06's machine; the bench's terminal_line), or the
    error it raises."""
    sys.path.insert(0, str(ROOT / "bench"))
    import bench

    def decided(spec, **kw):
        raise Decided(spec)

    monkeypatch.setattr(guarded, "launch", decided)
    monkeypatch.setattr(magics, "launch", decided)
    words = written.split()
    precision = dict(zip(words[::2], words[1::2])).get("--mixed_precision")
    cli = __main__.build_parser().parse_args
    ways = {"cli": lambda: __main__._cmd_launch(cli(["launch", *(["--mixed-precision", precision] if precision else []),
                                                     "t.py"])),
            "built": lambda: nbtools.accelerate_launch("t.py", mixed_precision=precision),
            "%launch": lambda: magics.run_launch(f"accelerate launch {written} t.py"),
            "machine": lambda: machines.stand_in(MACHINE.replace("t.py", f"{written} t.py")).shown,
            "bench": lambda: bench.terminal_line("launch", f"accelerate launch {written} t.py", session.current().info,
                                                 "auto", tmp_path)}
    out = {}
    for name, way in ways.items():
        try:
            out[name] = way()
        except Decided as exc:
            out[name] = exc.spec.shown(1)
        except (ParameterError, SystemExit) as exc:
            out[name] = exc
    return out


def test_the_default_count_has_one_source(in_session, tmp_path, monkeypatch):
    monkeypatch.setattr(decide, "DEFAULT_PROCESSES", 3)
    in_session(probe=SIM8, n=decide.DEFAULT_PROCESSES)
    monkeypatch.setattr(decide, "OPEN", None)
    s = nbtools.setup(work_dir=str(tmp_path / "w"), info=info(SIM8))  # no count given: the one default
    try:
        assert s.num_processes == 3
        shown = entry_points(tmp_path, monkeypatch)
        for name, line in shown.items():
            if name == "machine":  # its flags as written; its CPU ranks are every machine's together
                assert "3 个 rank" in machines.stand_in(MACHINE).why, line
            else:
                assert "--num_processes 3 " in line, (name, line)
    finally:
        s.close()
    # and with no session open (a script or the CLI outside a notebook): the same one default, said as the default
    assert session.current() is None
    spec = decide.launch_spec(decide.parse_launch("accelerate launch t.py"), info=info(SIM8), cwd=tmp_path)
    assert spec.num_processes == 3 and "用 3 个进程（默认）" in spec.why, spec.why


def test_the_precision_list_has_one_source(in_session, tmp_path, monkeypatch):
    in_session(probe=SIM8)
    monkeypatch.setattr(decide, "MIXED_PRECISIONS", ("no", "fp16", "fp8"))  # a new value; bf16 gone
    refused = entry_points(tmp_path, monkeypatch, "--mixed_precision bf16")
    assert all(isinstance(e, (ParameterError, SystemExit)) for e in refused.values()), refused
    taken = entry_points(tmp_path, monkeypatch, "--mixed_precision fp8")
    assert all(isinstance(line, str) and "--mixed_precision fp8" in line for line in taken.values()), taken
    assert info(SIM8).mixed_precisions == ("no", "fp16", "fp8")


def test_the_visible_cards_have_one_source(in_session, tmp_path, monkeypatch):
    s = in_session(probe=SIM8)
    monkeypatch.setattr(decide.cards, "__code__", (lambda info, n: [str(7 - i) for i in range(n)]).__code__)  # its one home
    assert s.cards() == "7,6"
    shown = entry_points(tmp_path, monkeypatch, "--num_processes 2")
    machine = shown.pop("machine")
    assert "ASCEND_RT_VISIBLE_DEVICES" not in machine  # CPU ranks: no card is chosen
    assert all(line.startswith("ASCEND_RT_VISIBLE_DEVICES=7,6 ") for line in shown.values()), shown


# ---------------------------------------------------------------- no launch is built anywhere else


def test_no_other_module_builds_an_accelerate_launch_argv():
    """A list or tuple holding "launch" with "accelerate" (or the program found by executable()) is built only in
    decide.py; commands.command_here runs `%cmd --as-written accelerate launch` as written (05's trap)."""
    found = []
    for path in [*(ROOT / "nbtools").glob("*.py"), *(ROOT / "bench").glob("*.py")]:
        if path.name == "decide.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        compared = {id(c) for node in ast.walk(tree) if isinstance(node, ast.Compare) for c in node.comparators}
        # a name bound to "accelerate" (or to anything that names it) stands for the program: `prog = "accelerate"`
        aliases = {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign) and "accelerate" in
                   ast.unparse(node.value) for t in node.targets if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            if isinstance(node, (ast.List, ast.Tuple)) and id(node) not in compared:
                words = [ast.unparse(e) for e in node.elts]
                if "'launch'" in words and any("accelerate" in w or w in aliases for w in words):
                    found.append(f"{path.name}:{node.lineno}")
            if isinstance(node, ast.FunctionDef) and not (path.name == "commands.py" and node.name == "command_here"):
                if "executable('accelerate')" in ast.unparse(node).replace('"', "'"):
                    found.append(f"{path.name}:{node.name}")
    assert found == []


FAKE = """#!{python}
import json, os, sys
with open({log!r}, "a") as f:
    f.write(json.dumps({{"argv": sys.argv[1:], "marker": os.environ.get({marker!r})}}) + "\\n")
"""


def test_every_spawned_launch_came_from_the_normaliser(tmp_path, monkeypatch):
    """A notebook-free run of every entry point that starts an `accelerate launch`, with a stand-in `accelerate`
    that records what it was given: each one carries the normaliser's marker."""
    log, fake = tmp_path / "launches.jsonl", tmp_path / "accelerate"
    fake.write_text(FAKE.format(python=sys.executable, log=str(log), marker=decide.NORMALISED_ENV))
    fake.chmod(0o755)
    monkeypatch.setattr(decide, "executable", lambda name: str(fake))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("")
    quiet = guarded.LaunchOptions(echo=False)
    nbtools.accelerate_launch("t.py", num_processes=1, options=quiet)
    magics.run_launch("accelerate launch --num_processes 1 t.py")
    assert __main__.main(["launch", "--num-processes", "1", "t.py"]) == 0
    machines.run_machines([MACHINE.replace("machine_rank 0", f"machine_rank {r}") for r in range(2)], timeout=60)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(records) == 5 and all(r["argv"][0] == "launch" for r in records), records
    assert [r["marker"] for r in records] == ["1"] * 5, records
