"""Ascend's examples guard: examples-guards/accelerate-ascend-notebooks/ (manifest, scripts, constraints), the
launchable examples/NN_slug.sh, and .github/workflows/notebooks-on-ascend.yml, held to the notebooks and the README.
The rehearsal itself is README's ci:examples-guard command; the tests here read what it left (as test_notebooks.py
reads the series report) and run the scripts on a notebook that fails."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import nbformat
import pytest
import yaml
from conftest import RESULT_SCHEMA, ROOT, skip_outside_ci
from nbformat.v4 import new_code_cell, new_notebook
from packaging.requirements import Requirement

from nbtools.floors import IMAGE

GUARD = Path(ROOT) / "examples-guards" / "accelerate-ascend-notebooks"
WORKFLOW = Path(ROOT) / ".github" / "workflows" / "notebooks-on-ascend.yml"
REHEARSED = {"examples/00_ascend_jupyterlab.sh": 1, "examples/02_distributed_eval.sh": 2}  # entry: cards
REHEARSAL_OUTPUT = Path(ROOT) / "nbtools-output" / "examples-guard"
REQUIRED = ("path", "profile", "runner", "image", "timeout_minutes")  # the guard's manifest-check, as read 2026-12-04


def manifest() -> dict:
    return yaml.safe_load((GUARD / "examples_manifest.yaml").read_text(encoding="utf-8"))


def notebook_code(stem: str) -> str:
    nb = nbformat.read(Path(ROOT) / "notebooks" / f"{stem}.ipynb", as_version=4)
    return "\n".join(c.source for c in nb.cells if c.cell_type == "code")


def readme_machine_seconds() -> dict[str, int]:
    table = (Path(ROOT) / "README.md").read_text(encoding="utf-8")
    return {m[1]: int(m[2]) for m in re.finditer(r"^\| \[`(\w+)`\]\(notebooks/.*\| (\d+) s \|$", table, re.M)}


def test_the_readme_rehearses_one_1_card_and_one_2_card_entry():
    readme = (Path(ROOT) / "README.md").read_text(encoding="utf-8")
    command = readme.split("<!-- ci:examples-guard ", 1)[1].split("```shell\n", 1)[1].split("\n", 1)[0]
    entries = re.search(r"for entry in ([\w ]+); do", command)[1].split()
    assert sorted(f"examples/{e}.sh" for e in entries) == sorted(REHEARSED) and sorted(REHEARSED.values()) == [1, 2]
    assert 'CI_OUTPUT_DIR="nbtools-output/examples-guard/$entry"' in command


def test_every_notebook_has_one_launchable_file_and_one_manifest_entry():
    stems = sorted(p.stem for p in (Path(ROOT) / "notebooks").glob("*.ipynb"))
    assert sorted(p.stem for p in (Path(ROOT) / "examples").glob("*.sh")) == stems
    for stem in stems:
        script = (Path(ROOT) / "examples" / f"{stem}.sh").read_text(encoding="utf-8")
        assert f'exec python -m nbtools run "$(dirname "$0")/../notebooks/{stem}.ipynb" "$@"' in script, stem
    data = manifest()
    assert data["version"] == 1 and data["scan"]["root"] == "examples"
    assert set(data["scan"]["include_extensions"]) == {".sh", ".py"}  # the guard's scan never reads .ipynb
    assert sorted(e["path"] for e in data["supported"]) == [f"examples/{s}.sh" for s in stems]


def test_each_entry_has_the_runner_timeout_profile_and_image_its_notebook_needs():
    seconds = readme_machine_seconds()
    for entry in manifest()["supported"]:
        stem = Path(entry["path"]).stem
        assert not [f for f in REQUIRED if not entry.get(f)] and (Path(ROOT) / entry["path"]).is_file(), entry
        assert all(isinstance(a, str) and a.strip() for a in entry.get("overlay_args", [])), entry
        code = notebook_code(stem)
        cards = 2 if "%launch" in code or "npu:1" in code else 1  # ranks on two cards, or a model split over two
        assert entry["runner"] == f"linux-aarch64-a2-{cards}", entry
        assert entry["timeout_minutes"] == 20 + math.ceil(10 * seconds[stem] / 60), entry
        assert entry["profile"] == ("notebooks-deepspeed" if "deepspeed" in code.lower() else "notebooks"), entry
        assert entry["image"] == IMAGE, entry


def test_setup_refuses_an_unknown_profile_before_installing_anything(tmp_path):
    proc = subprocess.run(["bash", str(GUARD / "scripts" / "setup_example.sh"), "notebook"], capture_output=True,
                          text=True, env={**os.environ, "TARGET_ROOT": ROOT})
    assert proc.returncode == 1 and "unknown profile: notebook (supported: notebooks notebooks-deepspeed)" in proc.stderr
    for profile in {e["profile"] for e in manifest()["supported"]}:  # every profile the manifest names is a case
        assert re.search(rf"^  {re.escape(profile)}\)", (GUARD / "scripts" / "setup_example.sh").read_text(), re.M)


def test_the_scripts_say_what_is_missing(tmp_path):
    run = GUARD / "scripts" / "run_example.sh"
    env = {k: v for k, v in os.environ.items() if k not in ("TARGET_ROOT", "CI_OUTPUT_DIR", "ASCEND_SET_ENV")}
    proc = subprocess.run(["bash", str(run), "examples/02_distributed_eval.sh"], capture_output=True, text=True, env=env)
    assert proc.returncode != 0 and "TARGET_ROOT is required" in proc.stderr
    env.update(TARGET_ROOT=ROOT, CI_OUTPUT_DIR=str(tmp_path / "out"), ASCEND_SET_ENV="/nonexistent/set_env.sh")
    proc = subprocess.run(["bash", str(run), "examples/02_distributed_eval.sh"], capture_output=True, text=True, env=env)
    assert proc.returncode == 1 and "CANN's set_env.sh not found (/nonexistent/set_env.sh)" in proc.stderr


def test_the_constraints_allow_no_cuda_wheel_on_the_aarch64_runners_and_nothing_else_elsewhere():
    lines = [ln for ln in (GUARD / "constraints-npu.txt").read_text().splitlines() if ln and not ln.startswith("#")]
    for req in map(Requirement, lines):
        assert str(req.specifier) == "<0" and not req.specifier.contains("0.0.1"), req
        assert req.marker.evaluate({"platform_machine": "aarch64"}) and not req.marker.evaluate({"platform_machine": "x86_64"})


def test_the_workflow_lints_and_uses_the_manifests_fields():
    for lint in (["check-jsonschema", "--builtin-schema", "vendor.github-workflows"],
                 ["zizmor", "--offline", "--config", str(Path(ROOT) / ".github" / "zizmor.yml")]):
        exe = shutil.which(lint[0], path=os.path.dirname(sys.executable)) or shutil.which(lint[0])
        assert exe, f"{lint[0]} is not installed: pip install -r requirements-dev.txt"
        proc = subprocess.run([exe, *lint[1:], str(WORKFLOW)], capture_output=True, text=True, cwd=ROOT)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    flow = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    job = flow["jobs"]["notebook"]
    used = set(re.findall(r"matrix\.entry\.(\w+)", WORKFLOW.read_text(encoding="utf-8")))
    assert used >= set(REQUIRED) and used <= set(REQUIRED) | {"overlay_args"}, used
    assert job["container"]["image"] == "${{ matrix.entry.image }}" and job["runs-on"] == "${{ matrix.entry.runner }}"
    assert "HF_ENDPOINT" in job["env"] and "vars.HF_ENDPOINT" in job["env"]["HF_ENDPOINT"]
    upload = [s for s in job["steps"] if "upload-artifact" in s.get("uses", "")]
    assert upload and upload[0]["if"] == "always()" and upload[0]["with"]["path"].rstrip("/") == "guard-output"
    assert job["env"]["CI_OUTPUT_DIR"].endswith("/guard-output")


@pytest.mark.parametrize("entry", sorted(REHEARSED))
def test_the_rehearsal_left_a_valid_result_for_each_entry(entry):
    """What README's ci:examples-guard command left: setup_example.sh, then run_example.sh per entry."""
    result_file = REHEARSAL_OUTPUT / Path(entry).stem / "result.json"
    if not result_file.exists():
        skip_outside_ci(f"no {result_file}: run README's ci:examples-guard command first")
    result = json.loads(result_file.read_text(encoding="utf-8"))
    jsonschema.validate(result, RESULT_SCHEMA)
    runner = next(e["runner"] for e in manifest()["supported"] if e["path"] == entry)
    assert runner == f"linux-aarch64-a2-{REHEARSED[entry]}"  # one 1-card entry and one 2-card entry
    assert (result["job_status"], result["path"], result["source"]) == ("success", entry, "upstream")
    assert result["device"]["kind"] == "npu" and result["device"]["simulated"] is True
    report = json.loads((result_file.parent / "report" / "report.json").read_text(encoding="utf-8"))
    assert result["checks"] == report["summary"]["checks"] and report["notebooks"][0]["status"] == "passed"


def test_a_failing_notebook_gives_failure_and_the_scripts_exit_status(tmp_path):
    """A target checkout with one notebook whose check fails: run_example.sh exits non-zero and leaves
    result.json with job_status failure, its path the entry's."""
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "examples").mkdir()
    stem = "02_distributed_eval"
    shutil.copy(Path(ROOT) / "examples" / f"{stem}.sh", tmp_path / "examples")
    nb = new_notebook(cells=[new_code_cell("import nbtools\nnbtools.passed('guard-fine', 'ok')"),
                             new_code_cell("assert 1 + 1 == 3, 'broken on purpose'")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "notebooks" / f"{stem}.ipynb")
    out = tmp_path / "out"
    env = {**os.environ, "TARGET_ROOT": str(tmp_path), "CI_OUTPUT_DIR": str(out), "OVERLAY_ARGS": '["--timeout 120"]',
           "ASCEND_SET_ENV": str(Path(ROOT) / "simnpu" / "cann" / "set_env.sh"), "RESULT_IMAGE": IMAGE}
    proc = subprocess.run(["bash", str(GUARD / "scripts" / "run_example.sh"), f"examples/{stem}.sh"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode != 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads((out / "result.json").read_text(encoding="utf-8"))
    jsonschema.validate(result, RESULT_SCHEMA)
    assert (result["job_status"], result["path"], result["image"]) == ("failure", f"examples/{stem}.sh", IMAGE)
    assert "(2 overlay args)" in proc.stdout and (out / "report" / "report.json").is_file()


def test_the_bundle_holds_the_run_and_no_path_host_or_token_of_the_machine(tmp_path):
    import socket
    import zipfile

    run = tmp_path / "run"
    run.mkdir()
    token, home, host = "hf_" + "Ab3" * 8, "/home/alice-bundle-test", socket.gethostname()
    planted = f"{home}/work/notebooks/x.py on {host} in {ROOT} and {run} with {token} and {sys.prefix}/bin/python"
    for name in ("report.json", "result.json", "junit.xml"):
        (run / name).write_text(json.dumps({"file": name, "seen": planted}), encoding="utf-8")
    env = {**os.environ, "HOME": home, "HF_TOKEN": "plantedsecret42", "PYTHONPATH": ROOT}
    proc = subprocess.run([sys.executable, "-m", "nbtools", "report", str(run), "--bundle"], capture_output=True,
                          text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0 and "nbtools-bundle.zip" in proc.stdout, proc.stderr
    with zipfile.ZipFile(run / "nbtools-bundle.zip") as z:
        assert sorted(z.namelist()) == ["environment.txt", "junit.xml", "report.json", "result.json"]
        texts = {n: z.read(n).decode("utf-8") for n in z.namelist()}
    assert json.loads(texts["result.json"])["file"] == "result.json" and "accelerate env" in texts["environment.txt"]
    for text in texts.values():
        for leak in ("/home/", home, ROOT, str(run), str(tmp_path), token, "plantedsecret42", sys.prefix):
            assert leak not in text, leak
        if len(host) >= 4 and host != "localhost":
            assert host not in text
    assert "<home>/work/notebooks/x.py" in texts["report.json"] and "<token>" in texts["report.json"]
    missing = subprocess.run([sys.executable, "-m", "nbtools", "report", str(tmp_path), "--bundle"], capture_output=True,
                             text=True, env=env)
    assert missing.returncode == 2 and "has no report.json, result.json, junit.xml" in missing.stderr
