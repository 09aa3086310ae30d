"""The runner on small synthetic notebooks (real papermill, real kernels)."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from xml.etree import ElementTree as ET

import nbformat
import pytest
from conftest import RESULT_SCHEMA, processes_mentioning, skip_outside_ci  # CI's Debian has localedef: GBK runs there
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from nbtools import ParameterError, detect
from nbtools.checks import SEED_CHECKS, VERDICT_MIME
from nbtools.device import CACHE_ENV
from nbtools.lang import msg
from nbtools.params import convert_parameter, parse_params
from nbtools.report import UNKNOWN


def make_nb(path: Path, cells: list[tuple[str, list[str]]]) -> Path:
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells.append(new_markdown_cell("# test"))
    for src, tags in cells:
        nb.cells.append(new_code_cell(src, metadata={"tags": tags}))
    nbformat.write(nb, path)
    return path


PARAMS = ("device = 'auto'\nnum_processes = 2\nwork_dir = ''\n", ["parameters"])
# one cell claiming every seed id, so that a one-notebook run can pass
ALL_SEED = (
    "import nbtools\nfor cid in nbtools.SEED_CHECKS:\n    nbtools.passed(cid, 'synthetic')",
    [f"check:{cid}" for cid in SEED_CHECKS],
)
# the lines a kernel's own log printed into a passing run before (issue 11, point 8)
KERNEL_NOISE = ("IPKernelApp", "without encryption", "KeyboardInterrupt")


def run_cli(*args, cwd=None, env=None, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nbtools", "run", *args],
        capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env, encoding="utf-8",
    )


def outputs(nb, name: str | None = None) -> str:
    return "".join(
        o.get("text", "")
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if name is None or o.get("name") == name
    )


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    d = tmp_path_factory.mktemp("series")
    make_nb(
        d / "00_good.ipynb",
        [
            (PARAMS[0] + "accelerate_ref = ''\nhome = ''\nflag = False\nratio = 0.5\n", ["parameters"]),
            ("import os, nbtools\nprint('cwd=' + os.getcwd())\nprint('np=' + str(num_processes))\n"
             "print('wd=' + work_dir)\nprint('types=' + repr((accelerate_ref, home, flag, ratio)))\n"
             "print('env=' + repr({k: os.environ.get(k) for k in ('NBTOOLS_UNATTENDED', 'PYTHONIOENCODING', 'PYTHONUTF8')}))\n"
             f"print('run-env=' + repr((os.environ.get('TMPDIR'), {CACHE_ENV!r} in os.environ)))", []),
            ("assert num_processes == 3\nnbtools.passed('check-py', 'ok')", ["check:check-py"]),
            ("nbtools.skipped('acc-install-source', 'needs the network')",
             ["check:acc-install-source", "needs:network", "needs:param=accelerate_ref"]),
            # statuses pinned by the needs: tags: a skip where nothing is needed, a pass where an NPU is needed
            ("nbtools.skipped('extra-skips-wrongly', '只在 NPU 上检查：演示')", ["check:extra-skips-wrongly"]),
            ("nbtools.passed('extra-passes-wrongly')", ["check:extra-passes-wrongly", "needs:npu"]),
            ("print('no verdict here')", ["check:extra-silent"]),
            # a verdict is data the cell displays: a printed line that looks like one, or another check's, is none
            ("print('[check] PASSED extra-printed -- 只是打印的一行')", ["check:extra-printed"]),
            ("nbtools.passed('extra-other-id', 'ok')", ["check:extra-wrong-id"]),
            # tqdm-like progress on stderr, no newline, then the verdict on stdout
            ("import sys, time\nsys.stderr.write(' 50%|#####     | 5/10\\r')\nsys.stderr.flush()\ntime.sleep(0.3)\n"
             "nbtools.passed('extra-stderr', 'after a progress bar')", ["check:extra-stderr"]),
        ],
    )
    make_nb(
        d / "01_bad.ipynb",
        [
            (PARAMS[0] + "ratio = ''\n", ["parameters"]),
            ("print('ratio=' + repr(ratio))", []),
            ("import nbtools\nassert 1 + 1 == 3, 'arithmetic is broken'\nnbtools.passed('acc-launch')", ["check:acc-launch"]),
            ("nbtools.passed('acc-prepare')", ["check:acc-prepare"]),
        ],
    )
    make_nb(
        d / "02_exit.ipynb",
        [
            PARAMS,
            ("import sys\nsys.exit(0)", []),
            ("import nbtools\nnbtools.passed('acc-env')", ["check:acc-env"]),
        ],
    )
    out = tmp_path_factory.mktemp("out")
    proc = run_cli(
        str(d), "-p", "num_processes=3", "-p", "accelerate_ref=1.10", "-p", "home=~", "-p", "flag=YES",
        "-p", "ratio=2", "--output", str(out), cwd=tmp_path_factory.mktemp("elsewhere"),
    )
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    return d, out, proc, report


def test_a_failing_check_reaches_report_json_as_data(series):
    """The failing cell's index, its check, the exception's name, value and traceback: as the kernel reported them in
    the executed notebook, unchanged in report.json (no text read back)."""
    _, out, _, report = series
    failure = next(n for n in report["notebooks"] if n["path"] == "01_bad.ipynb")["failure"]
    executed = nbformat.read(out / "01_bad.ipynb", as_version=4)
    executed.cells = [c for c in executed.cells if "papermill-error-cell-tag" not in c.metadata.get("tags", [])]
    index = next(i for i, c in enumerate(executed.cells) if "check:acc-launch" in c.metadata.get("tags", []))
    error = next(o for o in executed.cells[index].outputs if o.output_type == "error")
    assert (failure["cell_index"], failure["check_id"], failure["exec_count"]) == (
        index, "acc-launch", executed.cells[index].execution_count)
    assert (failure["ename"], failure["evalue"]) == (error.ename, error.evalue) == ("AssertionError", "arithmetic is broken")
    assert len(failure["traceback"]) == len(error.traceback) and "assert 1 + 1 == 3" in "".join(failure["traceback"])
    assert next(n for n in report["notebooks"] if n["path"] == "00_good.ipynb")["failure"] is None


def test_exit_code_is_non_zero_when_anything_failed(series):
    _, _, proc, report = series
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert report["summary"]["ok"] is False


def test_notebook_statuses_include_sys_exit_as_failed(series):
    _, _, _, report = series
    by = {n["path"]: n for n in report["notebooks"]}
    assert by["00_good.ipynb"]["status"] == "passed"
    assert by["01_bad.ipynb"]["status"] == "failed" and "arithmetic is broken" in by["01_bad.ipynb"]["error"]
    assert by["02_exit.ipynb"]["status"] == "failed" and "个单元格没有运行" in by["02_exit.ipynb"]["error"]
    assert all(n["duration_s"] > 0 for n in report["notebooks"])


def test_check_statuses(series):
    _, _, _, report = series
    by = {c["id"]: c for c in report["checks"]}
    assert by["check-py"]["status"] == "passed" and by["check-py"]["notebook"] == "00_good.ipynb"
    assert by["acc-install-source"] == {
        "id": "acc-install-source", "status": "skipped", "notebook": "00_good.ipynb",
        "reason": "needs the network", "seed": True,
    }
    for cid in ("extra-silent", "extra-printed", "extra-wrong-id"):
        assert (by[cid]["status"], by[cid]["reason"]) == ("failed", msg("checks.no_verdict", "zh", check_id=cid)), by[cid]
    assert "extra-other-id" not in by  # a verdict counts for the id its cell is tagged with, nowhere else
    assert by["acc-launch"]["status"] == "failed" and "AssertionError" in by["acc-launch"]["reason"]
    assert by["acc-prepare"]["status"] == "failed" and "没有运行" in by["acc-prepare"]["reason"]
    assert by["acc-env"]["status"] == "failed"
    if detect().kind == "cpu":  # the pin: expected from the tags and this machine's probe
        assert by["extra-skips-wrongly"]["status"] == "failed" and by["extra-skips-wrongly"]["reason"] == (
            "跳过了，但这台机器满足它的条件：它没有 needs 标签，应当处处通过（跳过的理由：只在 NPU 上检查：演示）")
        assert by["extra-passes-wrongly"] == {"id": "extra-passes-wrongly", "status": "failed", "notebook": "00_good.ipynb",
                                              "reason": "通过了，但它需要 npu，这里没有：needs 标签与检查不一致", "seed": False}
    # every seed id has an entry; those no cell claims are 'missing'
    assert set(SEED_CHECKS) <= set(by)
    assert by["acc-dispatch"]["status"] == "missing"


def test_the_verdict_is_the_cells_displayed_data_beside_the_line_a_reader_sees(series):
    """passed() in a kernel displays its verdict as VERDICT_MIME data with the printed line as text/plain; a stderr
    chunk without a newline (tqdm's '\\r') before it changes nothing."""
    _, out, _, report = series
    nb = nbformat.read(out / "00_good.ipynb", as_version=4)
    (cell,) = [c for c in nb.cells if "check:extra-stderr" in c.metadata.get("tags", [])]
    assert [o.output_type for o in cell.outputs] == ["stream", "display_data"], cell.outputs  # the case is real
    assert cell.outputs[1].data == {VERDICT_MIME: {"check": "extra-stderr", "status": "passed", "reason": "after a progress bar"},
                                    "text/plain": "[check] PASSED extra-stderr -- after a progress bar"}
    by = {c["id"]: c for c in report["checks"]}
    assert by["extra-stderr"]["status"] == "passed" and by["extra-stderr"]["reason"] == "after a progress bar"


def test_parameters_injected_and_cwd_is_the_notebook_folder(series):
    d, out, _, _ = series
    text = outputs(nbformat.read(out / "00_good.ipynb", as_version=4))
    assert f"cwd={d}" in text
    assert "np=3" in text
    assert "wd=/" in text  # the runner hands every notebook a private work dir


def test_p_values_convert_by_each_notebooks_default(series):
    """str defaults keep the text ('1.10' is no float, '~' no None); bool/int/float convert; per notebook."""
    _, out, _, report = series
    good = outputs(nbformat.read(out / "00_good.ipynb", as_version=4))
    assert "types=('1.10', '~', True, 2.0)" in good
    bad = outputs(nbformat.read(out / "01_bad.ipynb", as_version=4))
    assert "ratio='2'" in bad  # 01 declares ratio = '' (a str), 00 ratio = 0.5 (a float)
    by = {n["path"]: n for n in report["notebooks"]}
    assert by["00_good.ipynb"]["parameters"]["ratio"] == 2.0 and by["01_bad.ipynb"]["parameters"]["ratio"] == "2"
    assert report["parameters"] == {"num_processes": "3", "accelerate_ref": "1.10", "home": "~", "flag": "YES",
                                    "ratio": "2"}  # as typed


def test_kernels_run_unattended_and_in_utf8(series):
    _, out, _, _ = series
    text = outputs(nbformat.read(out / "00_good.ipynb", as_version=4))
    # unattended (the notebooks' work folders are private and removed), UTF-8 whatever the locale
    assert "env={'NBTOOLS_UNATTENDED': '1', 'PYTHONIOENCODING': 'utf-8', 'PYTHONUTF8': '1'}" in text


def test_run_network_lets_a_check_that_needs_the_network_pass(tmp_path):
    """`run --network` tells the runner (NBTOOLS_NETWORK) that checks tagged needs:network are expected to run here;
    without it, such a pass fails as unexpected."""
    nb = make_nb(tmp_path / "00_net.ipynb", [PARAMS, ("import nbtools\nnbtools.passed('extra-net')", ["check:extra-net", "needs:network"])])
    env = {k: v for k, v in os.environ.items() if k != "NBTOOLS_NETWORK"}
    for flag, network, status in ((["--network"], True, "passed"), ([], False, "failed")):
        run_cli(*flag, str(nb), "--output", str(tmp_path / f"out{network}"), env=env)
        report = json.loads((tmp_path / f"out{network}" / "report.json").read_text(encoding="utf-8"))
        assert report["device"]["network"] is network
        assert {c["id"]: c["status"] for c in report["checks"]}["extra-net"] == status, report["checks"]


def test_kernels_get_the_runs_tmpdir_and_its_device_probe(series):
    """Given to each kernel (its env at start), not set in the runner's own environment."""
    _, out, _, _ = series
    text = outputs(nbformat.read(out / "00_good.ipynb", as_version=4))
    tmpdir, has_probe = ast.literal_eval(re.search(r"^run-env=(.*)$", text, re.M).group(1))
    assert re.fullmatch(r".*/nbtools-run-[^/]+/tmp", tmpdir) and has_probe, text
    assert not Path(tmpdir).exists(), "the run's temp folder was left behind"


def test_report_files(series):
    _, out, proc, report = series
    assert {"report.json", "report.md", "junit.xml", "00_good.ipynb", "00_good.kernel.log"} <= {
        p.name for p in out.iterdir()
    }
    assert report["device"]["kind"] == detect().kind
    assert report["device"]["network"] is False and isinstance(report["device"]["deepspeed"], bool)  # what was weighed
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "| acc-install-source | skipped | 00_good.ipynb | needs the network |" in md
    assert "[00_good.kernel.log](00_good.kernel.log)" in md


def test_junit_counts_match_report_json_and_the_cli(series):
    """The counts the fixture was built to give: 00 passes, 01 fails a check, 02 exits early; check-py and
    extra-stderr pass, acc-install-source skips, extra-silent, extra-printed and extra-wrong-id (no verdict for their
    id), acc-launch (its assertion),
    acc-prepare and acc-env (never ran) fail, extra-skips-wrongly and extra-passes-wrongly fail their needs: tags
    (on a host without an NPU), and the seed ids no notebook claims are missing."""
    _, out, proc, report = series
    missing = len(set(SEED_CHECKS) - {"check-py", "acc-install-source", "acc-launch", "acc-prepare", "acc-env"})
    expected = {"tests": 3 + 11 + missing, "failures": 2 + 8 + missing, "skipped": 1}
    suite = ET.parse(out / "junit.xml").getroot()
    cases = suite.findall("testcase")
    assert {k: int(suite.get(k)) for k in expected} == expected == report["summary"]["junit"]
    assert len(cases) == expected["tests"]
    assert len([c for c in cases if c.find("failure") is not None]) == expected["failures"]
    assert len([c for c in cases if c.find("skipped") is not None]) == expected["skipped"]
    (said,) = [line for line in proc.stdout.splitlines() if line.startswith("FAILED: ")]
    for part in ("2 passed", "1 skipped", "8 failed", f"{missing} missing", "checks; 1/3 notebooks passed"):
        assert part in said, said


# Ascend's examples-guard result (cosdt-ci-test/workflows, .github/workflows/schemas/result.schema.json), as its
# required fields and enums were read on 2026-12-04; extra fields are allowed.
def test_result_json_has_the_guards_six_fields_and_says_unknown_where_nothing_told_it(series):
    import jsonschema

    _, out, proc, report = series
    result = json.loads((out / "result.json").read_text(encoding="utf-8"))
    jsonschema.validate(result, RESULT_SCHEMA)
    assert result["job_status"] == "failure" and "result.json" in proc.stdout  # 01 and 02 failed
    github = {"trigger": "GITHUB_EVENT_NAME", "target_repo": "GITHUB_REPOSITORY", "target_ref": "GITHUB_SHA", "image": ""}
    for field, var in github.items():  # the run's environment is this test's: derived from it, never assumed
        assert result[field] == (os.environ.get(f"RESULT_{field.upper()}") or os.environ.get(var) or UNKNOWN.get(field, "unknown")), field
    assert result["path"] == "00_good.ipynb 01_bad.ipynb 02_exit.ipynb"
    assert result["device"]["kind"] == report["device"]["kind"] and result["checks"] == report["summary"]["checks"]
    assert result["versions"]["torch"] == report["device"]["versions"]["torch"] and "deepspeed" in result["versions"]


def test_result_json_takes_its_fields_from_github_or_result_variables():
    from nbtools.report import result_record
    from nbtools.run_results import NotebookResult, RunReport

    ran = RunReport(device={"kind": "npu", "count": 2, "simulated": True}, notebooks=[NotebookResult("02.ipynb", "passed")])
    env = {"GITHUB_EVENT_NAME": "schedule", "GITHUB_REPOSITORY": "o/r", "GITHUB_SHA": "abc", "RESULT_IMAGE": "cann:9.1.0",
           "RESULT_PATH": "notebooks/02.ipynb", "RESULT_TRIGGER": "workflow_dispatch"}
    got = result_record(ran, env)
    assert (got["trigger"], got["target_repo"], got["target_ref"], got["image"], got["path"], got["job_status"]) == (
        "workflow_dispatch", "o/r", "abc", "cann:9.1.0", "notebooks/02.ipynb", "success")
    assert got["device"] == {"kind": "npu", "count": 2, "names": None, "simulated": True}
    ran.stopped_by = "SIGINT"
    assert result_record(ran, {})["job_status"] == "cancelled" and result_record(ran, {})["image"] == "unknown"


def test_unknown_parameter_is_refused_before_running(tmp_path):
    make_nb(tmp_path / "00_x.ipynb", [PARAMS])
    proc = run_cli(str(tmp_path), "-p", "num_proceses=2", "--output", str(tmp_path / "o"))
    assert proc.returncode == 2
    assert "num_proceses not declared by any notebook; declared: device, num_processes, work_dir" in proc.stderr


def test_unconvertible_value_is_refused_before_any_kernel_starts(tmp_path):
    make_nb(tmp_path / "00_x.ipynb", [PARAMS, ("open('ran', 'w').write('yes')", [])])
    out = tmp_path / "o"
    proc = run_cli(str(tmp_path), "-p", "num_processes=two", "--output", str(out))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "num_processes='two'" in proc.stderr and "(int)" in proc.stderr and "00_x.ipynb" in proc.stderr
    assert not (tmp_path / "ran").exists() and not out.exists()


def test_a_notebook_and_its_twin_of_one_name_are_refused_before_running(tmp_path):
    """A Chinese notebook and its English twin share a file name: one run would write both executed copies to one file."""
    make_nb(tmp_path / "00_x.ipynb", [PARAMS, ("open('ran', 'w').write('yes')", [])])
    (tmp_path / "en").mkdir()
    make_nb(tmp_path / "en" / "00_x.ipynb", [PARAMS])
    out = tmp_path / "o"
    proc = run_cli(str(tmp_path / "00_x.ipynb"), str(tmp_path / "en" / "00_x.ipynb"), "--output", str(out))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "00_x.ipynb: two notebooks of one name in one run" in proc.stderr and "nbtools run -o DIR" in proc.stderr
    assert not (tmp_path / "ran").exists() and not out.exists()


@pytest.mark.parametrize(
    "default, text, value",
    [
        ("", "1.10", "1.10"), ("", "~", "~"), ("", "", ""), ("", " a b ", " a b "), ("", "true", "true"),
        (2, "3", 3), (2, " 3 ", 3), (0.5, "2", 2.0), (0.5, "1e-3", 0.001),
        (False, "true", True), (False, "YES", True), (True, "0", False), (True, "No", False), (True, "FALSE", False),
        (None, "~", None), (None, "[1, 2]", [1, 2]), (None, "x", "x"),
    ],
)
def test_convert_parameter_by_the_default_type(default, text, value):
    got = convert_parameter("p", text, default, "00_x.ipynb")
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize("default, text", [(2, "two"), (2, "2.5"), (2, ""), (0.5, "half"), (False, "maybe"), (True, "")])
def test_convert_parameter_refuses_with_name_type_and_value(default, text):
    with pytest.raises(ParameterError) as err:
        convert_parameter("p", text, default, "00_x.ipynb")
    msg = str(err.value)
    assert f"p={text!r}" in msg and f"({type(default).__name__})" in msg and "00_x.ipynb" in msg


def test_parse_params_keeps_the_text():
    assert parse_params(["a=2", "b=bf16", "c=true", "d=", "e=1.5", "f=x=y"]) == {
        "a": "2", "b": "bf16", "c": "true", "d": "", "e": "1.5", "f": "x=y"
    }
    with pytest.raises(ParameterError, match="expected NAME=VALUE"):
        parse_params(["a"])


# --- a clean run to read: no kernel log lines in the terminal, the log in a file the report links ---


def test_passing_run_prints_no_kernel_log_and_links_the_log_file(tmp_path):
    """ipykernel warned 'running over TCP without encryption' once per notebook, and logged
    'KeyboardInterrupt caught in kernel' when jupyter_client's shutdown interrupted an idle kernel.
    The sentinel below sits in the kernel's process group and records any SIGINT sent to it."""
    sentinel = tmp_path / "sigint-seen"
    marker = f"sentinel-{uuid.uuid4().hex}"
    ready = tmp_path / "sentinel-ready"
    sentinel_code = (
        "import signal, sys, time\n"
        f"signal.signal(signal.SIGINT, lambda *a: (open({str(sentinel)!r}, 'w').write('SIGINT'), sys.exit()))\n"
        f"open({str(ready)!r}, 'w').close()\n"
        f"time.sleep(6)  # {marker}"
    )
    make_nb(
        tmp_path / "00_clean.ipynb",
        [
            ("work_dir = ''\n", ["parameters"]),
            ("import os, subprocess, sys, time\n"  # a background child, in the kernel's process group
             f"subprocess.Popen([sys.executable, '-c', {sentinel_code!r}])\n"
             f"while not os.path.exists({str(ready)!r}):\n    time.sleep(0.05)", []),
            ALL_SEED,
        ],
    )
    out = tmp_path / "out"
    proc = run_cli(str(tmp_path / "00_clean.ipynb"), "--output", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for noise in KERNEL_NOISE:
        assert noise not in proc.stdout + proc.stderr, (noise, proc.stdout + proc.stderr)
    log = out / "00_clean.kernel.log"
    assert log.is_file()
    assert "without encryption" not in log.read_text(encoding="utf-8", errors="replace")  # IPC: no TCP at all
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert report["notebooks"][0]["kernel_log"] == log.name
    assert f"[{log.name}]({log.name})" in (out / "report.md").read_text(encoding="utf-8")
    assert f'class="kernel-log" href="{log.name}"' in (out / "index.html").read_text(encoding="utf-8")
    deadline = time.monotonic() + 15
    while processes_mentioning(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not sentinel.exists(), "the kernel's shutdown interrupted an idle kernel (SIGINT to its process group)"


def test_failed_notebook_names_its_kernel_log(tmp_path):
    make_nb(tmp_path / "00_dies.ipynb", [("import os\nos._exit(3)", [])])
    out = tmp_path / "out"
    proc = run_cli(str(tmp_path / "00_dies.ipynb"), "--output", str(out))
    assert proc.returncode == 1
    assert f"kernel log of 00_dies.ipynb: {out / '00_dies.kernel.log'}" in proc.stdout
    assert (out / "00_dies.kernel.log").is_file()


# --- the kernel's environment: UTF-8 whatever the locale -------------------------------------

UTF8_TEXT = "中文输出 ✓ naïve 😀"  # the check mark and the emoji are not in GBK
CHILD = f"print({UTF8_TEXT!r})"  # a Python child of the kernel, printing it


@pytest.fixture(scope="session")
def gbk_locale(tmp_path_factory):
    """LOCPATH and name of a zh_CN GBK locale: an installed one, else one generated with localedef."""
    have = subprocess.run(["locale", "-a"], capture_output=True, text=True).stdout.split() if shutil.which("locale") else []
    for name in have:
        if "gbk" in name.lower() or name.lower().endswith(".gb18030"):
            return {}, name
    if not shutil.which("localedef"):
        skip_outside_ci("no GBK locale installed and no localedef to generate one")
    d = tmp_path_factory.mktemp("locale")
    proc = subprocess.run(["localedef", "-i", "zh_CN", "-f", "GBK", str(d / "zh_CN.GBK")], capture_output=True, text=True)
    if proc.returncode not in (0, 1) or not (d / "zh_CN.GBK").exists():  # 1: warnings, locale written
        skip_outside_ci(f"cannot generate a GBK locale: localedef exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
    return {"LOCPATH": str(d)}, "zh_CN.GBK"


@pytest.mark.parametrize("where", ["C", "GBK"])
def test_kernel_output_is_utf8_whatever_the_locale(where, tmp_path, request):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "LANG", "PYTHONIOENCODING", "PYTHONUTF8"))}
    if where == "GBK":
        extra, name = request.getfixturevalue("gbk_locale")
        env.update(extra, LANG=name, LC_ALL=name)
        probe = subprocess.run([sys.executable, "-c", "import locale; print(locale.getpreferredencoding(False))"],
                               env=env, capture_output=True, text=True)
        assert probe.stdout.strip().upper() == "GBK", probe  # the case is real
    else:
        env.update(LANG="C", LC_ALL="C")
    make_nb(
        tmp_path / "00_utf8.ipynb",
        [
            ("import subprocess, sys, nbtools\n"
             f"r = subprocess.run([sys.executable, '-c', {CHILD!r}], capture_output=True, text=True)\n"
             "print(r.stdout + r.stderr)\n"
             "nbtools.passed('extra-utf8', r.stdout.strip())", ["check:extra-utf8"]),
        ],
    )
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "nbtools", "run", str(tmp_path / "00_utf8.ipynb"), "--output", str(out)],
        capture_output=True, timeout=300, env=env,
    )
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    by = {c["id"]: c for c in report["checks"]}
    assert by["extra-utf8"]["status"] == "passed", (by["extra-utf8"], proc.stdout[-2000:], proc.stderr[-2000:])
    assert by["extra-utf8"]["reason"] == UTF8_TEXT
    nb = nbformat.read(out / "00_utf8.ipynb", as_version=4)
    assert UTF8_TEXT in outputs(nb, "stdout")


# --- --kernel: the device is probed with the kernel's own interpreter -------------------------


def install_kernel(jupyter_path: Path, name: str, argv0: str) -> None:
    d = jupyter_path / "kernels" / name
    d.mkdir(parents=True)
    (d / "kernel.json").write_text(json.dumps({
        "argv": [argv0, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": name, "language": "python",
    }))


def test_unknown_kernel_lists_the_installed_ones(tmp_path):
    make_nb(tmp_path / "00_x.ipynb", [PARAMS])
    proc = run_cli(str(tmp_path), "--kernel", "no-such-kernel", "--output", str(tmp_path / "o"))
    assert proc.returncode == 2
    assert "--kernel 'no-such-kernel': no such Jupyter kernel" in proc.stderr
    listed = subprocess.run([sys.executable, "-m", "jupyter", "kernelspec", "list", "--json"],
                            capture_output=True, text=True)
    names = sorted(json.loads(listed.stdout)["kernelspecs"])
    assert "installed (`jupyter kernelspec list`): " + ", ".join(names) in proc.stderr


def test_kernel_python_fills_the_specs_variables_from_this_environment(tmp_path, monkeypatch):
    """A spec written by nbtools.kernels keeps ``${PATH}``: the device probe must see what the
    kernel will see (jupyter_client fills it from the server's environment), not a literal ``${PATH}``."""
    from nbtools.runner import kernel_python

    jp = tmp_path / "jupyter"
    install_kernel(jp, "withenv", sys.executable)
    spec_file = jp / "kernels" / "withenv" / "kernel.json"
    spec = json.loads(spec_file.read_text())
    spec["env"] = {"PATH": "/cann/bin:${PATH}", "ODD": "a$$b", "NEW": "${NBTOOLS_NO_SUCH_VAR}"}
    spec_file.write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", str(jp))
    exe, env = kernel_python("withenv")
    assert exe == sys.executable
    assert env == {"PATH": f"/cann/bin:{os.environ['PATH']}", "ODD": "a$b", "NEW": "${NBTOOLS_NO_SUCH_VAR}"}


def kernel_run(tmp_path: Path, argv0: str) -> tuple[subprocess.CompletedProcess, dict, str]:
    jp = tmp_path / "jupyter"
    install_kernel(jp, "other", argv0)
    make_nb(tmp_path / "00_torch.ipynb", [("import torch\nprint('kernel torch=' + torch.__version__)", [])])
    out = tmp_path / "out"
    env = dict(os.environ, JUPYTER_PATH=str(jp))
    proc = run_cli(str(tmp_path / "00_torch.ipynb"), "--kernel", "other", "--output", str(out), env=env)
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    text = outputs(nbformat.read(out / "00_torch.ipynb", as_version=4)) if (out / "00_torch.ipynb").exists() else ""
    return proc, report, text


def test_kernel_probe_uses_the_kernels_interpreter_fake_torch(tmp_path):
    """Anywhere: the kernel's interpreter is a wrapper that puts a stand-in torch first on its path."""
    fake = tmp_path / "fake"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("__version__ = '0.0.1+kerneltest'\n")
    wrapper = tmp_path / "kernel-python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={fake} exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    proc, report, text = kernel_run(tmp_path, str(wrapper))
    assert report["device"]["versions"]["torch"] == "0.0.1+kerneltest", proc.stdout + proc.stderr
    assert "kernel torch=0.0.1+kerneltest" in text
    assert "torch 0.0.1+kerneltest" in proc.stdout and report["kernel"] == "other"


def test_a_relative_output_dir_works_from_any_cwd(tmp_path):
    """The README's own command uses the default output, a path relative to the caller's cwd,
    while each kernel runs in its notebook's folder: everything must still land in one place."""
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    make_nb(nbs / "00_one.ipynb", [PARAMS, ALL_SEED])
    caller = tmp_path / "caller"
    caller.mkdir()
    proc = run_cli(str(nbs / "00_one.ipynb"), "--output", "rel/out", cwd=caller)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = caller / "rel" / "out"
    assert (out / "report.json").is_file() and (out / "00_one.ipynb").is_file() and (out / "00_one.kernel.log").is_file()
    report = json.loads((out / "report.json").read_text())
    assert report["notebooks"][0]["status"] == "passed", report["notebooks"]
