"""tools/classroom.py: N learner containers on one Ascend host, on the simulated NPU's 8-card npu-smi."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

from nbtools import device

SCRIPT = str(Path(ROOT) / "tools" / "classroom.py")


def _classroom(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, **device.environment(cards=8))  # its npu-smi lists 8 cards, as an 8-card host's does
    return subprocess.run([sys.executable, SCRIPT, *args, "--out", str(tmp_path / "start.sh")], env=env,
                          capture_output=True, text=True, timeout=120)


def test_four_learners_on_an_8_card_host_get_disjoint_pairs_of_cards(tmp_path):
    proc = _classroom(tmp_path, "--learners", "4")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    script = (tmp_path / "start.sh").read_text()
    runs = [line for line in script.splitlines() if line.startswith("docker run")]
    cards = [re.findall(r"--device=/dev/davinci(\d+)\b", line) for line in runs]
    assert len(runs) == 4 and all(len(c) == 2 for c in cards), cards
    assert sorted(int(c) for pair in cards for c in pair) == list(range(8))  # disjoint, every card used once
    ports = [re.search(r"-p (\d+):8888", line).group(1) for line in runs]
    tokens = re.findall(r"token=([0-9a-f]{32})", proc.stdout)
    assert len(set(ports)) == 4 and len(set(tokens)) == 4, proc.stdout
    assert script.count("docker build") == 1 and all("/dev/davinci_manager" in line for line in runs)
    assert subprocess.run(["bash", "-n", str(tmp_path / "start.sh")]).returncode == 0


def test_more_learners_than_cards_is_refused_with_the_hosts_needed(tmp_path):
    proc = _classroom(tmp_path, "--learners", "5")
    assert proc.returncode != 0 and "10 cards; this host has 8: use 2 hosts" in proc.stderr, proc.stderr
    assert not (tmp_path / "start.sh").exists()
