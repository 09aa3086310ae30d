import os

import pytest

from nbtools.npusmi import cards_seen, parse_npu_smi, summary

# The quick-start's sample table (two 910B4, nothing running).
SAMPLE = """
+------------------------------------------------------------------------------------------------+
| npu-smi 25.5.2                   Version: 25.5.2                                               |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     910B4               | OK            | 89.9        39                0    / 0             |
| 0                         | 0000:41:00.0  | 0           0    / 0          2922 / 32768         |
+===========================+===============+====================================================+
| 1     910B4               | OK            | 89.9        39                0    / 0             |
| 1                         | 0000:42:00.0  | 0           0    / 0          2922 / 32768         |
+===========================+===============+====================================================+
+---------------------------+---------------+----------------------------------------------------+
| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |
+===========================+===============+====================================================+
| No running processes found in NPU 0                                                            |
| No running processes found in NPU 1                                                            |
+===========================+===============+====================================================+
"""

RUNNING = SAMPLE.replace(
    "| No running processes found in NPU 0                                                            |",
    "| 0       0                 | 12345         | python3.11               | 2100                    |",
).replace(
    "| No running processes found in NPU 1                                                            |",
    "| 1       0                 | 12346         | python3.11               | 2101                    |",
)


def test_sample_table_npus():
    t = parse_npu_smi(SAMPLE)
    assert t["version"] == "25.5.2"
    assert [n["id"] for n in t["npus"]] == [0, 1]
    n0 = t["npus"][0]
    assert n0["name"] == "910B4" and n0["health"] == "OK"
    assert n0["power_w"] == 89.9 and n0["temp_c"] == 39
    assert (n0["hugepages_used"], n0["hugepages_total"]) == (0, 0)
    assert n0["chip"] == 0 and n0["bus_id"] == "0000:41:00.0" and n0["aicore_pct"] == 0
    assert (n0["memory_used_mb"], n0["memory_total_mb"]) == (0, 0)
    assert (n0["hbm_used_mb"], n0["hbm_total_mb"]) == (2922, 32768)
    assert t["npus"][1]["bus_id"] == "0000:42:00.0"
    assert t["processes"] == []


def test_spacing_does_not_matter():
    squeezed = "\n".join(" ".join(line.split()) for line in SAMPLE.splitlines())
    assert parse_npu_smi(squeezed) == parse_npu_smi(SAMPLE)
    tabs = SAMPLE.replace("    ", "\t").replace("\n", "\r\n")
    assert parse_npu_smi(tabs) == parse_npu_smi(SAMPLE)


def test_running_processes():
    t = parse_npu_smi(RUNNING)
    assert t["processes"] == [
        {"npu": 0, "chip": 0, "pid": 12345, "name": "python3.11", "memory_mb": 2100},
        {"npu": 1, "chip": 0, "pid": 12346, "name": "python3.11", "memory_mb": 2101},
    ]
    assert len(t["npus"]) == 2
    assert "进程 12345（python3.11）在 NPU 0 上：2100 MB" in summary(t)


def test_summary_of_sample():
    text = summary(parse_npu_smi(SAMPLE))
    assert text.splitlines() == [
        "NPU 0 chip 0: 910B4 health=OK HBM 2922 / 32768 MB",
        "NPU 1 chip 1: 910B4 health=OK HBM 2922 / 32768 MB",
        "  没有运行中的进程",
    ]


def test_unhealthy_and_missing_values():
    text = SAMPLE.replace("| 1     910B4               | OK     ", "| 1     910B4               | Alarm  ")
    text = text.replace("89.9        39                0    / 0             |\n| 1 ", "NA          39                0    / 0             |\n| 1 ")
    t = parse_npu_smi(text)
    assert t["npus"][1]["health"] == "Alarm"
    assert t["npus"][1]["power_w"] is None
    assert t["npus"][0]["power_w"] == 89.9


def test_two_chips_per_npu_give_two_entries():
    text = """
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)                       |
+===========================+===============+====================================================+
| 0     310P3               | OK            | NA          50                0    / 0             |
| 0                         | 0000:01:00.0  | 0           1200 / 44280                           |
| 1                         | 0000:01:00.1  | 0           1100 / 43693                           |
+===========================+===============+====================================================+
"""
    t = parse_npu_smi(text)
    assert [(n["id"], n["chip"], n["name"]) for n in t["npus"]] == [(0, 0, "310P3"), (0, 1, "310P3")]
    assert [n["memory_used_mb"] for n in t["npus"]] == [1200, 1100]
    assert "hbm_total_mb" not in t["npus"][0]
    assert t["version"] is None


def test_not_a_table():
    with pytest.raises(ValueError, match="no `npu-smi info` table"):
        parse_npu_smi("bash: npu-smi: command not found")


def test_cards_seen_without_torch(tmp_path):
    """check-torch's expectation: the visibility variable, else the device files, else npu-smi's table; 0 without any."""
    dev = tmp_path / "dev"
    dev.mkdir()
    bare = {"PATH": str(tmp_path / "nothing")}
    assert cards_seen("npu", bare, dev=str(dev)) == 0 and cards_seen("cuda", bare, dev=str(dev)) == 0
    assert cards_seen("npu", {**bare, "ASCEND_RT_VISIBLE_DEVICES": "4,5,6"}, dev=str(dev)) == 3
    assert cards_seen("cuda", {**bare, "CUDA_VISIBLE_DEVICES": ""}, dev=str(dev)) == 0  # set and empty: none
    for name in ("davinci0", "davinci1", "davinci_manager", "nvidia0", "nvidiactl"):
        (dev / name).touch()
    assert cards_seen("npu", bare, dev=str(dev)) == 2 and cards_seen("cuda", bare, dev=str(dev)) == 1
    tool = tmp_path / "bin" / "npu-smi"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\ncat <<'EOF'\n" + SAMPLE + "\nEOF\n")
    tool.chmod(0o755)
    path = f"{tool.parent}{os.pathsep}{os.environ['PATH']}"
    assert cards_seen("npu", {"PATH": path}, dev=str(tmp_path / "nodev")) == 2  # the sample's two 910B4
