"""nbtools/perf.py (notebook 09's readers) and the stand-in's torch_npu.profiler and contrib.transfer_to_npu."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from nbtools import perf

SITE = Path(__file__).resolve().parents[1] / "simnpu" / "site"

# The stand-in's message (simnpu/README.md, from torch_npu 2.9.0.post2's allocator) and the older one seen on hosts.
NPU_OOM = ("NPU out of memory. Tried to allocate 98.00 MiB (NPU 0; 32.00 GiB total capacity; 0 bytes already "
           "allocated; 0 bytes current active; 32.00 GiB free; 64.00 MiB allowed; 0 bytes reserved in total by PyTorch)."
           "If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.")
HOST_OOM = ("NPU out of memory. Tried to allocate 260.00 MiB (NPU 0; 28.50 GiB total capacity; 10.24 GiB already "
            "allocated; 10.24 GiB current active; 149.57 MiB free; 10.28 GiB reserved in total by PyTorch)")


def test_read_oom_gives_every_size_in_bytes():
    assert perf.read_oom(NPU_OOM) == {"tried": 98 * 2**20, "total": 32 * 2**30, "allocated": 0,
                                      "free": 32 * 2**30, "allowed": 64 * 2**20, "reserved": 0}
    host = perf.read_oom(HOST_OOM)
    assert "allowed" not in host and host["free"] == round(149.57 * 2**20)
    assert perf.within_print(host["allocated"], 10.24 * 2**30 + 2**20)  # printed with two decimals of GiB
    assert not perf.within_print(host["allocated"], 10.30 * 2**30)
    assert perf.read_oom("RuntimeError: something else") == {}
    cuda = perf.read_oom("CUDA out of memory. Tried to allocate 96.00 MiB. GPU 0 has a total capacity of 79.19 GiB of "
                         "which 78.50 GiB is free. Of the allocated memory 0 bytes is allocated by PyTorch, and 0 bytes "
                         "is reserved by PyTorch but unallocated.")
    assert cuda == {"tried": 96 * 2**20, "total": round(79.19 * 2**30), "allocated": 0, "free": round(78.5 * 2**30)}


def test_trace_readers(tmp_path):
    events = [{"ph": "X", "name": "ProfilerStep#1", "dur": 100}, {"ph": "X", "name": "ProfilerStep#2", "dur": 90},
              {"ph": "X", "name": "aten::mm", "dur": 30}, {"ph": "X", "name": "aten::mm", "dur": 20},
              {"ph": "X", "name": "aten::add", "dur": 40}, {"ph": "i", "name": "aten::huge", "dur": 999},
              {"ph": "X", "name": "autograd::engine::evaluate_function: MmBackward0", "dur": 500}]
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    assert perf.profiled_steps(trace) == [1, 2]
    assert perf.top_ops(trace, 2) == [("aten::mm", 50.0), ("aten::add", 40.0)]


def test_peaks_only_for_listed_cards():
    assert perf.peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.0
    assert perf.peak_tflops("Ascend910B4", "bf16") is None and perf.peak_tflops("cpu", "no") is None


def test_stand_in_profiler_and_transfer_to_npu(tmp_path):
    """The stand-in's torch_npu.profiler writes trace_view.json where the real one puts its results, and
    transfer_to_npu sends CUDA code to the NPU (what it cannot translate: a compared device type)."""
    code = textwrap.dedent("""
        import glob, json, torch, torch_npu
        import torch_npu.profiler as P
        m = torch.nn.Linear(8, 8).to("npu")
        with P.profile(activities=[P.ProfilerActivity.CPU, P.ProfilerActivity.NPU],
                       schedule=P.schedule(wait=0, active=2, warmup=1, repeat=1),
                       on_trace_ready=P.tensorboard_trace_handler("prof")) as prof:
            for _ in range(4):
                m(torch.ones(2, 8, device="npu")).sum().backward()
                prof.step()
        print(json.dumps(glob.glob("prof/*_ascend_pt/ASCEND_PROFILER_OUTPUT/trace_view.json")))
        from torch_npu.contrib import transfer_to_npu  # noqa: F401
        x = torch.ones(2, device="cuda")
        print(torch.cuda.is_available(), x.device, torch.nn.Linear(2, 2).cuda().weight.device, x.is_cuda,
              x.device.type == "cuda", torch.ones(1).to("cuda:0").device, torch.cuda.get_device_name(0))
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SIMNPU_", "ASCEND_"))}
    env.update(PYTHONPATH=str(SITE), SIMNPU_STATE_DIR=str(tmp_path / "state"), CUDA_VISIBLE_DEVICES="")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    traces_line, transfer_line = r.stdout.strip().splitlines()[-2:]
    traces = json.loads(traces_line)
    assert len(traces) == 1 and perf.profiled_steps(tmp_path / traces[0]) == [1, 2]  # steps 1 and 2 (0: warm-up)
    assert transfer_line == "True npu:0 npu:0 True False npu:0 Ascend910B4"
