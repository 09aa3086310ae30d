"""The device probe is cached between processes, keyed on what its answers depend on."""

from __future__ import annotations

import subprocess
import sys

from nbtools import device


def test_a_second_detect_reuses_the_probe_and_errors_are_never_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    calls = []

    def fake_probe(python=None, timeout=120):
        calls.append(python)
        return {"python": "3.11.7", "torch": "2.14.1+cu130", "cuda_available": False}

    monkeypatch.setattr(device, "run_probe", fake_probe)
    assert device.cached_probe()["torch"] == "2.14.1+cu130"
    assert device.cached_probe()["torch"] == "2.14.1+cu130"
    assert len(calls) == 1, "the second call probed again"
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "0,1")  # other devices visible: another answer
    device.cached_probe()
    assert len(calls) == 2
    monkeypatch.setenv("SIMNPU_SOC", "Ascend310P3")  # a rehearsal of another simulated card: another answer
    device.cached_probe()
    assert len(calls) == 3
    monkeypatch.setattr(device, "run_probe", lambda python=None, timeout=120: calls.append(1) or {"torch_error": "x"})
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "0")
    device.cached_probe()
    device.cached_probe()
    assert len(calls) == 5, "an answer reporting a problem was cached"


def test_a_second_cli_call_reads_the_cache_instead_of_probing(tmp_path):
    env = {"XDG_CACHE_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    cmd = [sys.executable, "-m", "nbtools", "detect"]
    subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=300)  # fills the cache
    (cache,) = tmp_path.joinpath("nbtools").glob("probe-*.json")
    written = cache.stat().st_mtime_ns
    second = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, timeout=300)
    assert cache.stat().st_mtime_ns == written, "the second call probed again (a probe imports torch: seconds)"
    assert "device:" in second.stdout
