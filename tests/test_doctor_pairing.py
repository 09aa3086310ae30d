"""The doctor's CANN pairing (issue 58): which torch_npu Ascend's compatibility table (nbtools/data/ascend_compat.json)
lists for the CANN found here, and whether the installed torch_npu is one of them; nothing where there is no CANN.

The CANN is torch_npu's (torch.version.cann: the simulated NPU's says 9.1.0+simulated) or, without one loaded, the
version in CANN's install info under ASCEND_HOME_PATH (here a stand-in file)."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import ROOT
from test_device import CPU, NPU2

from nbtools import doctor, simnpu_env
from nbtools.device import from_probe

TABLE = json.loads(doctor.COMPAT.read_text(encoding="utf-8"))


def pairing_row(probe: dict) -> doctor.Row | None:
    rows = doctor._pairing_rows(from_probe(probe))
    assert len(rows) <= 1, rows
    return rows[0] if rows else None


def cann_home(tmp_path, version: str) -> str:
    """A stand-in CANN: its install info where torch_npu's collect_env finds it (ascend_*_install.info under
    ASCEND_HOME_PATH), as the toolkit writes it (the field torch_npu reads is `version=`)."""
    info = tmp_path / "cann" / "aarch64-linux" / "ascend_toolkit_install.info"
    info.parent.mkdir(parents=True)
    info.write_text(f"package_name=Ascend-cann-toolkit\nversion={version}\ninnerversion=V100R001C26B001\narch=aarch64\n")
    return str(tmp_path / "cann")


def test_the_table_names_its_source_and_the_date_it_was_read_and_holds_the_pairs_the_issue_names():
    assert "github.com/Ascend/pytorch" in TABLE["source"] and TABLE["url"].startswith("https://gitcode.com/Ascend/pytorch")
    assert TABLE["read"] == "2026-12-06" and TABLE["recommended"] == {"torch_npu": "2.12.0", "torch": "2.12.0", "cann": "9.1.0"}
    by_npu = {npu: (torch, cann) for npu, torch, cann, _ in TABLE["rows"]}
    assert by_npu["2.9.0.post2"] == ("2.9.0", "9.0.0") and by_npu["2.9.0.post6"] == ("2.9.0", "9.1.0")
    assert [npu for npu, _, cann, _ in TABLE["rows"] if cann == "9.1.0"] == ["2.12.0", "2.11.0", "2.10.0.post4", "2.9.0.post6",
                                                                              "2.7.1.post8"]


def test_the_simulated_npus_cann_gets_the_torch_npu_the_table_lists_for_9_1_0():
    """The doctor as a learner runs it, on the simulated NPU: torch_npu 2.9.0.post2 (simulated) is the CANN 9.0.0 build;
    for 9.1.0 the table lists 2.9.0.post6 for torch 2.9.0, and 2.12.0 first."""
    env = {**os.environ, **simnpu_env.environment(cards=2)}  # what `--simulate-npu` gives every process
    proc = subprocess.run([sys.executable, "-m", "nbtools", "doctor"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr
    row = proc.stdout.split("[info] CANN pairing  ", 1)[-1].split("\n[", 1)[0]
    assert row.startswith("CANN 9.1.0+simulated, torch_npu 2.9.0.post2\n"), proc.stdout
    assert "2.9.0.post2 is the CANN 9.0.0 build; for CANN 9.1.0+simulated it lists torch_npu 2.12.0 (torch 2.12.0)" in row, row
    assert "2.9.0.post6 (torch 2.9.0)" in row and "read 2026-12-06" in row and "nothing was changed" in row, row


def test_a_cann_found_by_its_install_info_gets_its_own_row_of_the_table(tmp_path, monkeypatch):
    monkeypatch.setenv("ASCEND_HOME_PATH", cann_home(tmp_path, "9.0.0"))
    without = {k: v for k, v in NPU2.items() if k != "cann"}  # torch_npu loaded no CANN version: the file says it
    assert doctor.cann_version(from_probe(without)) == "9.0.0"
    row = pairing_row(without)
    assert (row.status, row.found) == (doctor.OK, "CANN 9.0.0, torch_npu 2.9.0.post2"), row
    assert "released together; for CANN 9.0.0 it lists torch_npu 2.9.0.post2 (torch 2.9.0), 2.8.0.post4 (torch 2.8.0), " \
           "2.7.1.post4 (torch 2.7.1)" in row.note, row
    cann_row = next(r for r in doctor._torch_rows(from_probe(without)) if r.what == "CANN")
    assert cann_row.found == "9.0.0" and cann_row.status == doctor.FAIL, cann_row  # below the series' floor, 9.1.0
    row = pairing_row(dict(CPU))  # a host with CANN and no torch_npu yet: which one to install
    assert (row.status, row.found) == (doctor.INFO, "CANN 9.0.0, torch_npu -"), row
    assert "no torch_npu here; for CANN 9.0.0 it lists torch_npu 2.9.0.post2 (torch 2.9.0)" in row.note, row


def test_a_cann_the_table_has_no_row_for_is_told_where_to_look(tmp_path, monkeypatch):
    monkeypatch.setenv("ASCEND_HOME_PATH", cann_home(tmp_path, "9.2.0"))
    row = pairing_row({k: v for k, v in NPU2.items() if k != "cann"})
    assert (row.status, row.found) == (doctor.INFO, "CANN 9.2.0, torch_npu 2.9.0.post2"), row
    assert row.note == (f"Ascend's compatibility table (read {TABLE['read']}, nbtools/data/ascend_compat.json) has no row "
                        f"for CANN 9.2.0: see {TABLE['url']}"), row


def test_without_cann_the_doctor_says_nothing_of_pairing(tmp_path, monkeypatch):
    monkeypatch.delenv("ASCEND_HOME_PATH", raising=False)
    assert pairing_row(dict(CPU)) is None and doctor.pairing(None, None) is None
    monkeypatch.setenv("ASCEND_HOME_PATH", str(tmp_path))  # set, but no CANN installed there
    assert pairing_row(dict(CPU)) is None
    assert "CANN pairing" not in doctor.render(doctor._torch_rows(from_probe(dict(CPU))) + doctor._pairing_rows(from_probe(dict(CPU))))


def test_the_table_ships_with_nbtools():
    """pyproject.toml's package data covers the table (an install that is not a checkout still has it)."""
    globs = re.search(r"^\[tool\.setuptools\.package-data\]\nnbtools = (\[.*?\])", Path(ROOT, "pyproject.toml").read_text(),
                      re.M).group(1)
    assert any(fnmatch.fnmatch("data/ascend_compat.json", g) for g in json.loads(globs)), globs
    assert doctor.COMPAT == Path(doctor.__file__).parent / "data" / "ascend_compat.json"
