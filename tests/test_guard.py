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
# Ascend's examples guard, the facts this project holds itself to (github.com/Ascend/docs, read 2026-12-05):
# scripts/check_supported_entries.py @ cbed62872701a11843ec911756490029202a5853 (the manifest-check),
# .github/workflows/examples-template.yml @ 30de239e0c181d7a6b543fe1c07b9be789e12717 (the run-example job; the same
# steps @ 09da86da9f8d7b85df4b0c45e99f71683cd7554a), .github/workflows/schemas/result.schema.json @
# 3abb7542e17b7064efa036857f1b3bc4067c5592, examples-guards/README.md @ 09da86da9f8d7b85df4b0c45e99f71683cd7554a.
REQUIRED = ("path", "profile", "runner", "image", "timeout_minutes")  # REQUIRED_FIELDS: each non-empty
SOURCES = ("upstream", "project")  # item.get('source', 'upstream'); project: the path is in the guard folder
OPTIONAL_STRINGS = ("exec", "launcher")  # each a non-empty string when present
OPTIONAL_LIST = "overlay_args"  # a list of non-empty strings (absent: [])
MATRIX_ONLY = ("npu_devices",)  # the template's "Set declared NPU visibility": ASCEND_RT_VISIBLE_DEVICES=<it>
ENTRY_FIELDS = {*REQUIRED, "source", *OPTIONAL_STRINGS, OPTIONAL_LIST, *MATRIX_ONLY}
SETUP_ENV = {"PROFILE": "profile", "EXAMPLE_PATH": "path", "EXEC": "exec"}  # the setup step's env (matrix.example.X)
RUN_ENV = {"EXAMPLE_PATH": "path", "EXAMPLE_SOURCE": "source || 'upstream'", "EXEC": "exec",
           "LAUNCHER": "launcher || ''", "PROFILE": "profile", "OVERLAY_ARGS": "toJSON(overlay_args)"}  # the run step's


def guard_errors(entry: dict, target_root: Path, project_root: Path) -> list[str]:
    """The guard's manifest-check (validate()) for one entry, written again from the facts above."""
    path, source = entry.get("path"), entry.get("source", "upstream")
    if not isinstance(path, str) or not path.strip() or Path(path).is_absolute() or ".." in Path(path).parts:
        return [f"{path!r}: path must be a non-empty relative path within its checkout"]
    if source not in SOURCES:
        return [f"{path}: source must be upstream or project"]
    if not ((project_root if source == "project" else target_root) / path).exists():
        return [f"{path}: missing from its checkout"]
    errors = [f"{path}: missing required field {f}" for f in REQUIRED if not entry.get(f)]
    overlay = entry.get(OPTIONAL_LIST, [])
    if overlay is not None and not (isinstance(overlay, list) and all(isinstance(a, str) and a.strip() for a in overlay)):
        errors.append(f"{path}: overlay_args must be a list of non-empty strings")
    return errors + [f"{path}: {f} must be a non-empty string" for f in OPTIONAL_STRINGS
                     if f in entry and not (isinstance(entry[f], str) and entry[f].strip())]


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


def test_the_guards_check_passes_every_entry_and_fails_broken_ones():
    for entry in manifest()["supported"]:
        assert set(entry) <= ENTRY_FIELDS and guard_errors(entry, Path(ROOT), GUARD) == [], entry
    good = {"path": "examples/01_training.sh", "profile": "notebooks", "runner": "linux-aarch64-a2-2", "image": IMAGE,
            "timeout_minutes": 25, "exec": "examples/01_training.sh", "launcher": "x", "npu_devices": "0,1",
            "source": "upstream", "overlay_args": ["--timeout 600"]}
    assert guard_errors(good, Path(ROOT), GUARD) == []
    for broken in ({"exec": " "}, {"launcher": ""}, {"source": "elsewhere"}, {"overlay_args": "--timeout 600"},
                   {"image": ""}, {"path": "../x.sh"}, {"source": "project"}):  # project: not in the guard folder
        assert guard_errors({**good, **broken}, Path(ROOT), GUARD), broken


@pytest.mark.parametrize("stopped_by, ok, status", [("", True, "success"), ("", False, "failure"),
                                                     ("SIGTERM", True, "cancelled")])
def test_what_nbtools_writes_as_result_json_is_valid_for_the_guard(stopped_by, ok, status):
    """report.result_record (what every run writes) against the guard's schema (conftest.RESULT_SCHEMA, its one
    transcription), for each outcome, with the guard's fields from the environment and without them."""
    from nbtools.checks import Status
    from nbtools.report import result_record
    from nbtools.run_results import NotebookResult, RunReport

    nb = NotebookResult(path="notebooks/01_training.ipynb", status=Status.PASSED if ok else Status.FAILED)
    report = RunReport(device={"kind": "cpu", "count": 0}, notebooks=[nb], stopped_by=stopped_by)
    for environ in ({}, {"RESULT_IMAGE": IMAGE, "GITHUB_REPOSITORY": "Ascend/docs", "RESULT_SOURCE": "project"}):
        record = result_record(report, environ)
        jsonschema.validate(record, RESULT_SCHEMA)
        assert record["job_status"] == status
    for broken in ({"job_status": "passed"}, {"target_repo": "docs"}, {"image": ""}, {"source": "elsewhere"}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**record, **broken}, RESULT_SCHEMA)


def test_each_entry_has_the_runner_timeout_profile_and_image_its_notebook_needs():
    seconds = readme_machine_seconds()
    for entry in manifest()["supported"]:
        stem = Path(entry["path"]).stem
        assert (Path(ROOT) / entry.get("exec", entry["path"])).is_file(), entry
        code = notebook_code(stem)
        # ranks on two cards (a %launch that needs N ranks; a learner's own job, `%launch --fit`, fits one card), or a
        # model split over two
        cards = 2 if re.search(r"%launch(?! --fit)", code) or "npu:1" in code else 1
        assert entry["runner"] == f"linux-aarch64-a2-{cards}", entry
        if "npu_devices" in entry:  # ascending and one per card of the runner (an unsorted list hides the cards)
            ids = [int(i) for i in str(entry["npu_devices"]).split(",")]
            assert ids == sorted(set(ids)) and len(ids) == cards, entry
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
    assert used >= set(REQUIRED) and used <= ENTRY_FIELDS, used
    steps = {s.get("name", s.get("uses")): s for s in job["steps"]}
    for name, env in (("Setup", SETUP_ENV), ("Run", RUN_ENV)):  # the guard's variables, as its steps set them
        (step,) = [s for n, s in steps.items() if n.startswith(name)]
        assert step["env"] == {k: "${{ " + re.sub(r"^(toJSON\()?", r"\1matrix.entry.", v) + " }}"
                               for k, v in env.items()}, step["env"]
    visibility = steps["Set declared NPU visibility"]
    assert visibility["if"] == "matrix.entry.npu_devices" and visibility["env"]["NPU_DEVICES"] == "${{ matrix.entry.npu_devices }}"
    assert 'ASCEND_RT_VISIBLE_DEVICES=$NPU_DEVICES' in visibility["run"] and "GITHUB_ENV" in visibility["run"]
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
    assert result["image"] == IMAGE  # no RESULT_IMAGE in the rehearsal, as in the guard: the manifest entry's
    assert result["device"]["kind"] == "npu" and result["device"]["simulated"] is True
    report = json.loads((result_file.parent / "report" / "report.json").read_text(encoding="utf-8"))
    assert result["checks"] == report["summary"]["checks"] and report["notebooks"][0]["status"] == "passed"


def guard_run_env(entry: str, target_root: Path, out: Path, **given: str) -> dict[str, str]:
    """What the guard's run step gives run_example.sh (RUN_ENV, no RESULT_*), on the simulated NPU's set_env.sh."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RESULT_", "GITHUB_"))}
    return {**env, "EXAMPLE_PATH": entry, "EXAMPLE_SOURCE": "upstream", "EXEC": "", "LAUNCHER": "", "PROFILE": "notebooks",
            "OVERLAY_ARGS": "[]", "TARGET_ROOT": str(target_root), "CI_OUTPUT_DIR": str(out),
            "ASCEND_SET_ENV": str(Path(ROOT) / "simnpu" / "cann" / "set_env.sh"), **given}


def test_run_example_refuses_a_launcher_and_an_unknown_source(tmp_path):
    run = ["bash", str(GUARD / "scripts" / "run_example.sh"), "examples/02_distributed_eval.sh"]
    for given, said in (({"LAUNCHER": "accelerate-deepspeed"}, "launcher 'accelerate-deepspeed' is not one this project runs"),
                        ({"EXAMPLE_SOURCE": "elsewhere"}, "EXAMPLE_SOURCE must be upstream or project")):
        env = guard_run_env("examples/02_distributed_eval.sh", Path(ROOT), tmp_path / "out", **given)
        proc = subprocess.run(run, capture_output=True, text=True, env=env, timeout=60)
        assert proc.returncode == 2 and said in proc.stderr, proc.stderr


def test_a_failing_notebook_gives_failure_and_the_scripts_exit_status(tmp_path):
    """A target checkout with one notebook whose check fails, run on the simulated NPU with only what the guard's run
    step exports: run_example.sh exits non-zero, the log names the failing check and its reason, and result.json
    says failure, the entry's path and the manifest's image."""
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "examples").mkdir()
    stem = "02_distributed_eval"
    shutil.copy(Path(ROOT) / "examples" / f"{stem}.sh", tmp_path / "examples")
    broken = new_code_cell("assert 1 + 1 == 3, 'broken on purpose: 1 + 1 is 2'")
    broken.metadata["tags"] = ["check:guard-broken"]
    fine = new_code_cell("import nbtools\nnbtools.passed('guard-fine', 'ok')", metadata={"tags": ["check:guard-fine"]})
    nb = new_notebook(cells=[fine, broken])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "notebooks" / f"{stem}.ipynb")
    out = tmp_path / "out"
    env = guard_run_env(f"examples/{stem}.sh", tmp_path, out, OVERLAY_ARGS='["--simulate-npu", "--timeout 120"]')
    proc = subprocess.run(["bash", str(GUARD / "scripts" / "run_example.sh"), f"examples/{stem}.sh"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode != 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    table = proc.stdout[proc.stdout.index("status    check"):]  # the verdict table, as the job log keeps it
    assert re.search(r"^failed +guard-broken +02_distributed_eval.ipynb: .*broken on purpose: 1 \+ 1 is 2", table, re.M), table
    assert re.search(r"^passed +guard-fine ", table, re.M) and "device: NPU (simulated on CPU)" in table, table
    assert f"report.json: {out / 'report' / 'report.json'}" in table and "versions: python " in table, table
    result = json.loads((out / "result.json").read_text(encoding="utf-8"))
    jsonschema.validate(result, RESULT_SCHEMA)
    assert (result["job_status"], result["path"], result["image"]) == ("failure", f"examples/{stem}.sh", IMAGE)
    assert result["source"] == "upstream" and "(3 overlay args)" in proc.stdout and (out / "report" / "report.json").is_file()


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
