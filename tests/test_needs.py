"""Statuses pinned: a check's expected verdict comes from its needs: tags and the probe, and a verdict that differs fails."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from conftest import NOTEBOOKS

from nbtools.checks import NEEDS, NEEDS_PREFIX, VERDICT_MIME, Here, Status, check_ids, judge_checks, verdict, verdict_in
from nbtools.device import from_probe
from nbtools.lang import msg
from nbtools.runner import here_for

CPU = Here("cpu")
SIM_NPU = Here("npu", 2, simulated=True)
ONE_NPU = Here("npu", 1)
REAL_NPU = Here("npu", 8)
SIM_310P = Here("npu", 2, simulated=True, bf16=False)
CUDA = Here("cuda", 1)
THREE_OF_2 = Here("npu", 2, processes=3)  # a 3-rank job on a 2-card host: the CPU route (fewer cards than ranks)
ONE_OF_1 = Here("npu", 1, processes=1)  # a 1-rank job on a 1-card host: the card, not the CPU
HOSTS = {CPU, SIM_NPU, ONE_NPU, REAL_NPU, SIM_310P, CUDA, THREE_OF_2, ONE_OF_1}


@pytest.mark.parametrize("need, met_on", [
    ("npu", {SIM_NPU, ONE_NPU, REAL_NPU, SIM_310P, THREE_OF_2, ONE_OF_1}),
    ("real-npu", {ONE_NPU, REAL_NPU, THREE_OF_2, ONE_OF_1}),
    ("accelerator", {SIM_NPU, ONE_NPU, REAL_NPU, SIM_310P, CUDA, THREE_OF_2, ONE_OF_1}),
    # the launches take the CPU route: fewer cards than ranks (08b's CPU traps), whatever the count of ranks
    ("cpu", {CPU, ONE_NPU, CUDA, THREE_OF_2}),
    ("processes=2", {CPU, SIM_NPU, ONE_NPU, REAL_NPU, SIM_310P, CUDA, THREE_OF_2}),  # num_processes >= 2
    ("cards=2", {CPU, SIM_NPU, REAL_NPU, SIM_310P, THREE_OF_2}),  # a plain CPU meets it; one card does not
    ("cards=8", {CPU, REAL_NPU}),
    ("bf16", {CPU, SIM_NPU, ONE_NPU, REAL_NPU, CUDA, THREE_OF_2, ONE_OF_1}),
    ("network", set()),
    ("deepspeed", set()),
    ("param=accelerate_ref", set()),
])
def test_each_need_is_met_where_the_vocabulary_says(need, met_on):
    assert {h for h in HOSTS if h.meets(need)} == met_on


def test_flipping_one_need_flips_the_expected_status():
    tags = ["check:demo", "needs:network", "needs:param=accelerate_ref"]
    offline = Here("cpu", params_set=frozenset({"accelerate_ref"}))
    online = Here("cpu", network=True, params_set=frozenset({"accelerate_ref"}))
    # the same pass: pinned as failed where a need is unmet, kept where every need is met
    assert offline.pinned(tags, Status.PASSED, "ok")[0] is Status.FAILED
    assert online.pinned(tags, Status.PASSED, "ok") == (Status.PASSED, "ok")
    # and the same skip the other way round
    assert offline.pinned(tags, Status.SKIPPED, "no net") == (Status.SKIPPED, "no net")
    status, reason = online.pinned(tags, Status.SKIPPED, "no net")
    assert status is Status.FAILED and reason.startswith("跳过了，但这台机器满足它的条件：network、param=accelerate_ref")
    # one flipped fact of the probe: a 1-card NPU host becomes a 2-card one
    assert ONE_NPU.pinned(["needs:cards=2"], Status.SKIPPED, "1 card")[0] is Status.SKIPPED
    assert Here("npu", 2).pinned(["needs:cards=2"], Status.SKIPPED, "1 card")[0] is Status.FAILED


def test_a_check_without_needs_must_pass_and_failures_stay_failures():
    status, reason = CPU.pinned(["check:x"], Status.SKIPPED, "只在 NPU 上检查：演示")
    assert status is Status.FAILED and "它没有 needs 标签" in reason and "只在 NPU 上检查：演示" in reason
    status, reason = SIM_NPU.pinned(["needs:real-npu"], Status.PASSED, "")
    assert (status, reason) == (Status.FAILED, "通过了，但它需要 real-npu，这里没有：needs 标签与检查不一致")
    assert CPU.pinned(["needs:npu"], Status.FAILED, "boom") == (Status.FAILED, "boom")
    status, reason = CPU.pinned(["needs:gpu"], Status.PASSED, "")
    assert status is Status.FAILED and "needs:gpu" in reason  # a misspelt need never passes silently


def test_here_comes_from_the_probe_and_the_parameters():
    probe = {"torch": "2.9.0", "torch_npu": "2.9.0+simulated", "npu_simulated": True, "npu_available": True,
             "npu_count": 2, "npu_names": ["Ascend310P3"] * 2, "npu_bf16": False}
    info = from_probe(probe, environ={})
    defaults = {"device": "auto", "accelerate_ref": ""}
    here = here_for(info, {"accelerate_ref": "v1.15.0"}, defaults, deepspeed=True, network=False)
    assert here == Here("npu", 2, True, False, True, False, frozenset({"accelerate_ref"}), 2)
    assert here_for(info, {"num_processes": 1}, {**defaults, "num_processes": 2}, deepspeed=False,
                    network=False).meets("processes=2") is False
    assert here_for(info, {"device": "cpu"}, defaults, deepspeed=False, network=False).kind == "cpu"
    assert here_for(info, {"accelerate_ref": ""}, defaults, deepspeed=False, network=False).params_set == frozenset()


def shown(cid: str, status: str, reason: str = "") -> nbformat.NotebookNode:
    """The output passed()/skipped() display in a kernel (test_runner's series holds the real one to this)."""
    line = f"[check] {status.upper()} {cid}" + (f" -- {reason}" if reason else "")
    return nbformat.v4.new_output("display_data", data={VERDICT_MIME: {"check": cid, "status": status, "reason": reason},
                                                        "text/plain": line})


def test_judge_checks_pins_a_notebook_where_it_is_given_here(tmp_path):
    nb = nbformat.v4.new_notebook()
    for cid, needs, out in [("a", [], shown("a", "passed")), ("b", ["needs:npu"], shown("b", "skipped", "只在 NPU 上检查")),
                            ("c", [], shown("c", "skipped", "只在 NPU 上检查"))]:
        nb.cells.append(nbformat.v4.new_code_cell("", metadata={"tags": [f"check:{cid}", *needs]}, execution_count=1,
                                                  outputs=[out]))
    assert [c.status for c in judge_checks(nb, "x.ipynb")] == ["passed", "skipped", "skipped"]
    assert [c.status for c in judge_checks(nb, "x.ipynb", here=CPU)] == ["passed", "skipped", "failed"]
    assert [c.status for c in judge_checks(nb, "x.ipynb", here=SIM_NPU)] == ["passed", "failed", "failed"]


@pytest.mark.parametrize("outputs, want", [
    ([shown("a", "skipped", "原因")], (Status.SKIPPED, "原因")),
    ([shown("b", "passed"), shown("a", "passed", "x")], (Status.PASSED, "x")),  # the cell's own id, among others
    ([nbformat.v4.new_output("stream", name="stdout", text="[check] PASSED a -- 只是打印\n")], None),  # a line is no verdict
    ([shown("b", "passed")], None),  # another check's verdict
    ([shown("a", "failed", "?")], None),  # a status passed()/skipped() never give
])
def test_a_verdict_is_the_displayed_data_for_the_cells_own_id(outputs, want):
    assert verdict_in(outputs, "a") == want
    cell = nbformat.v4.new_code_cell("", metadata={"tags": ["check:a"]}, execution_count=1, outputs=outputs)
    (got,) = judge_checks(nbformat.v4.new_notebook(cells=[cell]), "x.ipynb")
    assert (got.status, got.reason) == (want or (Status.FAILED, msg("checks.no_verdict", "zh", check_id="a")))


def test_every_verdict_of_a_check_comes_from_the_one_judge():
    """checks.verdict decides each way a check ends (issue 59: judged in one place): the runner's not-run notebooks,
    its checks no notebook of the run carries, and every judged cell go through it."""
    error = nbformat.v4.new_output("error", ename="AssertionError", evalue="\x1b[31mfirst\x1b[0m\nsecond", traceback=[])
    cell = nbformat.v4.new_code_cell("", metadata={"tags": ["check:a", "needs:npu"]}, execution_count=1, outputs=[error])
    assert verdict(cell, "a") == (Status.FAILED, "AssertionError: first")
    assert verdict(cell, "a", full=True) == (Status.FAILED, "AssertionError: first\nsecond")
    assert verdict(cell, "a", not_run="没有运行：X") == (Status.FAILED, "没有运行：X")
    assert verdict(None, "a", "en", elsewhere="00_x.ipynb") == (Status.SKIPPED, msg("checks.not_selected", "en", notebook="00_x.ipynb"))
    assert verdict(None, "a", "en") == (Status.MISSING, msg("checks.untagged", "en", check_id="a"))
    never = nbformat.v4.new_code_cell("", metadata={"tags": ["check:a"]})
    assert verdict(never, "a", "en") == (Status.FAILED, msg("checks.not_reached", "en"))
    cell.outputs = [shown("a", "passed")]
    assert verdict(cell, "a") == (Status.PASSED, "")
    assert verdict(cell, "a", here=CPU)[0] is Status.FAILED  # a pass its needs contradict
    nb = nbformat.v4.new_notebook(cells=[cell])
    assert [(c.status, c.reason) for c in judge_checks(nb, "x.ipynb", not_run="没有运行：X")] == [(Status.FAILED, "没有运行：X")]


def test_every_needs_tag_of_the_series_is_in_the_vocabulary():
    known = {n.split("=")[0] for n in NEEDS}
    for path in sorted(Path(NOTEBOOKS).glob("*.ipynb")):
        for i, cell in enumerate(nbformat.read(path, as_version=4).cells):
            tags = cell.get("metadata", {}).get("tags", [])
            for need in check_ids(tags, NEEDS_PREFIX):
                assert check_ids(tags), f"{path.name} cell {i}: needs:{need} on a cell that is no check"
                assert need.split("=")[0] in known, f"{path.name} cell {i}: unknown need {need!r}"
                CPU.meets(need)  # raises on a malformed one (cards=x, param=)

