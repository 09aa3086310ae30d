"""nbtools.bigmodel: the measures notebook 03b's memory check relies on."""

from __future__ import annotations

import platform
import sys

import pytest

from nbtools import bigmodel

MB = 1_000_000


def test_ram_reports_rss_and_a_smaller_private_part():
    rss, private = bigmodel.ram()
    assert rss > 0
    assert 0 < private <= rss


def test_peak_ram_sees_an_allocation_and_its_release():
    with bigmodel.PeakRAM() as held:
        block = bytearray(64 * MB)  # zero pages: touch them so they count
        block[:: 4096] = b"x" * len(block[:: 4096])
    assert held.private_end >= 0.9 * 64 * MB, held
    assert held.private_peak >= held.private_end
    assert held.rss_peak >= held.private_peak * 0.9
    del block
    with bigmodel.PeakRAM() as freed:
        pass
    assert freed.private_end < 8 * MB, freed


def test_peak_ram_catches_a_peak_that_is_gone_by_the_end():
    with bigmodel.PeakRAM(interval=0.001) as m:
        block = bytearray(64 * MB)
        block[:: 4096] = b"x" * len(block[:: 4096])
        import time

        time.sleep(0.05)  # long enough for the sampler
        del block
        bigmodel.release_freed_memory()
    assert m.private_peak >= 0.9 * 64 * MB, m
    assert m.private_end < 0.5 * 64 * MB, m


def test_release_freed_memory_answers_whether_malloc_trim_exists():
    glibc = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
    assert bigmodel.release_freed_memory() is glibc  # malloc_trim is glibc's


def test_bytes_per_target_sums_module_sizes():
    sizes = {"a": 10, "b": 20, "c": 5}
    assert bigmodel.bytes_per_target({"a": "cpu", "b": "disk", "c": "cpu"}, sizes) == {"cpu": 15, "disk": 20}
    assert bigmodel.bytes_per_target({"a": 0, "b": 0}, sizes) == {"0": 30}


def test_tensor_bytes_per_device_skips_meta_and_named_modules():
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    model.register_buffer("scale", torch.ones(5))
    params = (4 * 3 + 3) + (3 * 2 + 2)
    assert bigmodel.tensor_bytes(model) == {"cpu": (params + 5) * 4}
    assert bigmodel.tensor_bytes(model, outside=["0", "1"]) == {"cpu": 5 * 4}  # only the unnamed buffer
    assert bigmodel.tensor_bytes(model, outside=[""]) == {}
    model[1].to("meta")
    assert bigmodel.tensor_bytes(model) == {"cpu": (4 * 3 + 3 + 5) * 4}
    half = torch.nn.Linear(2, 2, bias=False).to(torch.bfloat16)
    assert bigmodel.tensor_bytes(half) == {"cpu": 4 * 2}


def test_importing_memory_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, nbtools.bigmodel; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
