"""Execute the real notebook series on this machine's CPU, as CI and learners do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from conftest import (
    NOTEBOOKS,
    ROOT,
    isolated_prefix,
    on_its_own,
    required_ci_output,
    skip_outside_ci,
    without_offline_env,
)

from nbtools import detect
from nbtools.checks import NEEDS_PREFIX, SEED_CHECKS, Here, Status, check_ids, judge_checks
from nbtools.params import parameter_defaults
from nbtools.runner import finds, here_for

pytestmark = pytest.mark.notebook


def _git_status() -> str:
    return subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout


# The whole series runs once in CI, as the README's `ci:series` command (a newcomer's command); the suite
# reads that run's report rather than running the series a second time. What only a run of its own can
# prove (no network, no Hugging Face offline switch, started from another folder, the work tree left
# alone) is proven here on the notebooks that could reach the network: 00 installs packages, 07 loads a model with
# from_pretrained (03 calls from_pretrained only on the checkpoint folder it has just written in its work folder).
OFFLINE_NOTEBOOKS = ("00_environment.ipynb", "07_lora_finetune.ipynb")


@pytest.fixture(scope="module")
def series_report():
    """The report of the README's `ci:series` run (`--output nbtools-output/series`)."""
    out = required_ci_output("series", "series")
    return json.loads((out / "report.json").read_text()), out


def _save_tiny_llama(path: Path) -> None:
    """A model folder for 07's `model_id` path (from_pretrained, no network), made by `nbtools.tinybase` over 07's
    questions, with 3 layers and grouped-query attention (2 KV heads for 4 query heads), so the LoRA count 07 derives
    for k_proj / v_proj differs from q_proj's."""
    from test_own_job import tiny_model

    tiny_model(path / "model", arch="llama", layers=3, kv_heads=2)


@pytest.fixture(scope="module")
def offline_run(tmp_path_factory):
    """The notebooks that could reach the network (00, 07), with the network refused when the
    machine allows it, started from another folder, and without any Hugging Face offline switch in their
    environment: the notebooks must set what they need."""
    out = tmp_path_factory.mktemp("offline-out")
    model_dir = tmp_path_factory.mktemp("local-model")
    _save_tiny_llama(model_dir)
    model_dir = model_dir / "model"
    before = _git_status()
    with on_its_own() as prefix:
        proc = subprocess.run(
            [*prefix, sys.executable, "-m", "nbtools", "run", *(str(Path(NOTEBOOKS) / n) for n in OFFLINE_NOTEBOOKS),
             "--output", str(out), "-p", f"model_id={model_dir}"],
            capture_output=True,
            text=True,
            timeout=900,
            cwd=tmp_path_factory.mktemp("elsewhere"),
            env=without_offline_env(),
        )
    return proc, out, before, bool(prefix)


def test_series_passes_with_only_the_source_install_skipped(series_report):
    report, _ = series_report
    seed = {c["id"]: c for c in report["checks"] if c["seed"]}
    assert list(seed) == list(SEED_CHECKS)
    for cid, c in seed.items():
        if cid == "acc-install-source":
            assert c["status"] == "skipped" and "accelerate_ref" in c["reason"], c
        else:
            assert c["status"] == "passed", c
    assert [Path(n["path"]).name for n in report["notebooks"]] == sorted(p.name for p in Path(NOTEBOOKS).glob("*.ipynb"))
    assert all(n["status"] == "passed" for n in report["notebooks"])
    info = detect()
    assert (report["device"]["kind"], report["device"]["count"]) == (info.kind, info.count)


def expected_verdicts(nb, here: Here) -> dict[str, Status]:
    """Each check id of a notebook -> the verdict its needs: tags expect ``here``: passed where every need is met,
    else skipped (computed from the tags and the probe, never copied from a run)."""
    out = {}
    for cell in nb.cells:
        tags = cell.get("metadata", {}).get("tags")
        for cid in check_ids(tags):
            out[cid] = Status.SKIPPED if [n for n in check_ids(tags, NEEDS_PREFIX) if not here.meets(n)] else Status.PASSED
    return out


def test_every_check_of_the_series_ends_as_its_needs_expect(series_report):
    """Recomputed here from the notebooks' tags and the run's recorded probe (the runner pins the same way): a check
    that starts skipping, or passes where it cannot have run, fails the suite."""
    report, _ = series_report
    dev = report["device"]
    here = Here(dev["kind"], dev["count"], dev["simulated"], dev["bf16"], dev["deepspeed"], dev["network"])
    got = {(c["notebook"], c["id"]): c for c in report["checks"] if c["notebook"]}
    for path in sorted(Path(NOTEBOOKS).glob("*.ipynb")):
        for cid, want in expected_verdicts(nbformat.read(path, as_version=4), here).items():
            c = got[(path.name, cid)]
            assert c["status"] == want, (path.name, cid, c["status"], c["reason"])


def test_offline_notebooks_pass_and_leave_the_work_tree_unchanged(offline_run):
    proc, out, before, _ = offline_run
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads((out / "report.json").read_text())
    assert [Path(n["path"]).name for n in report["notebooks"]] == list(OFFLINE_NOTEBOOKS)
    assert all(n["status"] == "passed" for n in report["notebooks"]), report["notebooks"]
    real = next(c for c in report["checks"] if c["id"] == "lora-real-model")
    # 3 layers x r=8 x (q_proj, o_proj: 64 + 64; k_proj, v_proj: 64 + 2 * 16; gate, up, down: 64 + 128), derived here
    parts = real["reason"].split(": ", 1)[1].split("；")  # the model's own embeddings; the trainable count; held-out gain
    assert real["status"] == "passed" and f"{3 * 8 * (2 * 128 + 2 * 96 + 3 * 192)} 个可训练参数" in parts, real
    answers = next(c for c in report["checks"] if c["id"] == "lora-answers")
    assert answers["status"] == "passed", answers  # the local model, fine-tuned, answers better than before
    assert _git_status() == before


def test_offline_notebooks_need_no_network(offline_run):
    """A default run makes no network request: it passed inside a namespace with loopback only."""
    _, _, _, offline = offline_run
    if not offline:
        skip_outside_ci("cannot refuse network access here (`unshare -n` needs root): offline run not proven")
    probe = subprocess.run(
        [*isolated_prefix(), sys.executable, "-c", "import socket; socket.create_connection(('pypi.org', 443), timeout=5)"],
        capture_output=True,
        text=True,
    )
    assert probe.returncode != 0, "the namespace still reaches the network: the offline proof is void"


# The series run executes every notebook alone in a fresh kernel (cwd = its folder);
# these add papermill's own CLI started elsewhere (cwd = the caller's), for a notebook without a
# launch, one with a launch, and one with two concurrent launches.
@pytest.mark.parametrize("name", ["00_environment.ipynb", "02_distributed_eval.ipynb", "06_multi_node.ipynb"])
def test_notebook_passes_alone_under_plain_papermill_from_another_dir(name, tmp_path):
    """papermill's own CLI, started elsewhere, without --cwd, without nbtools run's environment
    (no NBTOOLS_UNATTENDED, no offline switches): every check of the notebook gives its verdict."""
    source = Path(NOTEBOOKS) / name
    here = here_for(detect(), {}, parameter_defaults(source), deepspeed=finds(sys.executable, "deepspeed"), network=False)
    expected = expected_verdicts(nbformat.read(source, as_version=4), here)
    assert expected, f"{name} has no check cells"
    out = tmp_path / name
    env = {k: v for k, v in without_offline_env().items() if not k.startswith("NBTOOLS_")}
    # a learner's terminal with the kernel's environment first on PATH, as the README's commands leave it (check-py)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    proc = subprocess.run(
        [sys.executable, "-m", "papermill", str(source), str(out), "-k", "python3", "--no-progress-bar"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = {c.id: c for c in judge_checks(nbformat.read(out, as_version=4), name)}
    assert set(got) == set(expected)
    for cid, want in expected.items():
        assert got[cid].status == want, (cid, got[cid])
        assert got[cid].status != "skipped" or got[cid].reason, (cid, "a skip needs its reason")


def test_the_pictures_are_drawn_and_shown_in_the_html_report(series_report):
    """At least four notebooks draw from the run's own numbers, and each picture is in its HTML page."""
    _, out = series_report
    drawn = {}
    for path in sorted(out.glob("*.ipynb")):
        pngs = [
            o["data"]["image/png"]
            for c in nbformat.read(path, as_version=4).cells
            for o in c.get("outputs", [])
            if "image/png" in o.get("data", {})
        ]
        if pngs:
            drawn[path] = pngs
    assert len(drawn) >= 4, f"only {[p.name for p in drawn]} draw"
    for path, pngs in drawn.items():
        page = (out / f"{path.stem}.html").read_text(encoding="utf-8")
        for png in pngs:
            assert png.strip()[:200] in page, f"{path.stem}.html lacks one of the notebook's pictures"
