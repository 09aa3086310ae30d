"""torch_npu turns its task queue off (TASK_QUEUE_ENABLE=0) when it is imported in an interactive interpreter; a
Jupyter kernel that imported torch would pass that 0 to every launch it starts, though the ranks are not interactive.
The normaliser (decide.launch_spec) gives the ranks the kernel's starting value instead (/proc/self/environ), keeps a
value the learner set (before the kernel started, or in the launch line) and says it in the why line (issue 58)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jupyter_client
import pytest

from nbtools import decide, simnpu_env

ROOT = Path(__file__).resolve().parent.parent
SAID = "torch_npu 因内核是交互式的而设的 TASK_QUEUE_ENABLE=0 不传给 rank"
sys.path.insert(0, str(Path(__file__).parent))
import test_normaliser  # noqa: E402
from test_normaliser import MACHINE, entry_points, spec_of  # noqa: E402

in_session = test_normaliser.in_session  # its fixture: an open session on a simulated 8-card host


def started_with(start: dict[str, str], now: str | None) -> dict:
    """interactive_settings() in a process started with ``start`` whose os.environ then holds ``now``."""
    code = ("import json, os\nfrom nbtools import decide\n"
            f"os.environ.pop('TASK_QUEUE_ENABLE', None)\nif {now!r} is not None: os.environ['TASK_QUEUE_ENABLE'] = {now!r}\n"
            "print(json.dumps(decide.interactive_settings()))")
    env = {k: v for k, v in os.environ.items() if k != "TASK_QUEUE_ENABLE"} | start | {"PYTHONPATH": str(ROOT)}
    return json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                     check=True).stdout)


@pytest.mark.parametrize("start, now, found", [
    ({}, "0", {"TASK_QUEUE_ENABLE": None}),  # torch_npu's 0 in a kernel started without it: unset for the ranks
    ({"TASK_QUEUE_ENABLE": "2"}, "0", {"TASK_QUEUE_ENABLE": "2"}),  # the learner's 2, overwritten by torch_npu
    ({"TASK_QUEUE_ENABLE": "0"}, "0", {}),  # the learner's own 0 before the kernel started: kept
    ({}, "1", {}),  # a value set in the kernel other than torch_npu's: kept
    ({}, None, {}),
])
def test_the_settings_come_from_the_environment_the_process_started_with(start, now, found):
    assert started_with(start, now) == found


def test_every_entry_point_leaves_the_kernels_0_out_and_says_so(in_session, tmp_path, monkeypatch):
    """%launch, a launch built in code, the CLI, a machine of 06 and the bench: one rule (the normaliser's)."""
    in_session()
    with monkeypatch.context() as m:  # as if this process had started with 2 and torch_npu had set its 0 since
        m.setattr(decide, "interactive_settings", lambda: {"TASK_QUEUE_ENABLE": "2"})
        for name, shown in entry_points(tmp_path, m).items():
            assert "TASK_QUEUE_ENABLE=2 " in str(shown), (name, shown)
    monkeypatch.setenv("TASK_QUEUE_ENABLE", "0")  # as torch_npu sets it in a kernel; this process started without it
    for spec in (spec_of("accelerate launch t.py", cwd=tmp_path), spec_of(MACHINE, cwd=tmp_path, machine=True)):
        assert spec.run_env()["TASK_QUEUE_ENABLE"] is None and SAID in spec.why, spec.why
    written = spec_of("TASK_QUEUE_ENABLE=0 accelerate launch t.py", cwd=tmp_path)  # written in the launch: kept
    assert written.run_env()["TASK_QUEUE_ENABLE"] == "0" and SAID not in written.why
    monkeypatch.delenv("TASK_QUEUE_ENABLE")
    plain = decide.launch_spec(decide.parse_launch("accelerate launch t.py"), cwd=tmp_path)
    assert "TASK_QUEUE_ENABLE" not in plain.run_env() and SAID not in plain.why


RANK = 'import os\nprint(f"task_queue={os.environ.get(\'TASK_QUEUE_ENABLE\', \'unset\')}", flush=True)\n'


@pytest.mark.parametrize("learner, ranks", [(None, "unset"), ("0", "0")])
def test_a_launch_from_a_kernel_that_imported_torch(learner, ranks, tmp_path):
    """A kernel on the simulated NPU imports torch (autoload imports torch_npu, which sets TASK_QUEUE_ENABLE=0 in an
    interactive interpreter); its %launch's ranks get no 0 unless the learner exported it before the kernel started."""
    (tmp_path / "tq.py").write_text(RANK)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env = {**env, **simnpu_env.environment(environ=env), "SIMNPU_CARDS": "2"}
    env.pop("TASK_QUEUE_ENABLE", None)
    if learner is not None:
        env["TASK_QUEUE_ENABLE"] = learner
    km = jupyter_client.KernelManager(kernel_name="python3")
    km.start_kernel(env=env, cwd=str(tmp_path))
    kc = km.client()
    try:
        kc.start_channels()
        kc.wait_for_ready(timeout=120)
        code = textwrap.dedent(f"""\
            import os, torch
            print("kernel: TASK_QUEUE_ENABLE " + os.environ["TASK_QUEUE_ENABLE"])  # torch_npu's (the stand-in's) interactive 0
            import nbtools
            %load_ext nbtools
            S = nbtools.setup(device="npu", num_processes=2, timeout_s=300)
            r = %launch accelerate launch --num_processes 2 {tmp_path / 'tq.py'}
            """)
        out = []
        reply = kc.execute_interactive(code, timeout=300, output_hook=lambda m: out.append(m["content"].get("text", "")
                                                                                          + str(m["content"].get("evalue", ""))))
        text = "".join(out)
        assert reply["content"]["status"] == "ok", text[-3000:]
        assert "kernel: TASK_QUEUE_ENABLE 0" in text, text[-3000:]
        assert text.count(f"task_queue={ranks}") == 2 and "task_queue=" + ("0" if ranks == "unset" else "unset") not in text, text[-3000:]
        assert (SAID in text) == (learner is None), text[-3000:]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
