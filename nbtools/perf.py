"""What notebooks 09 and 09b read from their workers: an out-of-memory message's numbers, a profiler trace's top operators,
and model FLOPs utilisation where a card's published peak is known.

- ``read_oom``: the sizes in a caching allocator's "out of memory" message (torch_npu's "NPU out of memory", torch's
  "CUDA out of memory"), in bytes.
- ``top_ops`` / ``profiled_steps``: from a chrome-trace json (torch's ``*.pt.trace.json``, torch_npu's
  ``ASCEND_PROFILER_OUTPUT/trace_view.json``), the complete events summed per name, and the ``ProfilerStep#N`` seen.
- ``PEAK_TFLOPS`` / ``peak_tflops``: dense peaks from the vendors' datasheets, by device name; none for Ascend
  (no per-SKU figure is published that we could cite) or the CPU: the notebook then takes the learner's figure.
- ``attention_outcome``: what building a model with an attention implementation and one forward pass gives here
  (08b: ``flash_attention_2`` against ``sdpa``).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

_UNITS = {"B": 1, "bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_SIZE = r"([\d.]+) (B|bytes|KiB|MiB|GiB|TiB)"
# torch_npu's wording first, then torch's for CUDA ("... GPU 0 has a total capacity of X of which Y is free ...")
OOM_FIELDS = {
    "tried": [rf"Tried to allocate {_SIZE}"],
    "total": [rf"{_SIZE} total capacity", rf"total capacity of {_SIZE}"],
    "allocated": [rf"{_SIZE} already allocated", rf"{_SIZE} is allocated by PyTorch"],
    "free": [rf"{_SIZE} free", rf"of which {_SIZE} is free"],
    "allowed": [rf"{_SIZE} allowed"],
    "reserved": [rf"{_SIZE} reserved in total by PyTorch"],
}

# Dense (no sparsity) tensor-core peaks in TFLOPS, from NVIDIA's datasheets ("H100 Tensor Core GPU" datasheet,
# SXM column; "H200 Tensor Core GPU" datasheet, the same figures): {name prefix: {dtype: peak}}.
_HOPPER = {"bf16": 989.0, "fp16": 989.0, "no": 67.0}
PEAK_TFLOPS = {"NVIDIA H100 80GB HBM3": _HOPPER, "NVIDIA H200": _HOPPER}


def read_oom(message: str) -> dict[str, int]:
    """The sizes an out-of-memory message states, in bytes (rounded as printed: two decimals of its unit)."""
    out = {}
    for key, patterns in OOM_FIELDS.items():
        if m := next(filter(None, (re.search(p, message) for p in patterns)), None):
            out[key] = round(float(m.group(1)) * _UNITS[m.group(2)])
    return out


def within_print(printed: int, exact: float) -> bool:
    """Whether ``printed`` (a size read back from a message) is ``exact`` as the message rounds it: two decimals of
    the unit it chose, so at most half a hundredth of that unit away."""
    unit = max(u for u in _UNITS.values() if u <= max(exact, 1))
    return abs(printed - exact) <= unit * 0.005 + 1


def _events(trace: Path) -> list[dict]:
    data = json.loads(Path(trace).read_text())
    return [e for e in (data["traceEvents"] if isinstance(data, dict) else data) if e.get("ph") == "X"]


def profiled_steps(trace: Path) -> list[int]:
    """The step numbers of the ``ProfilerStep#N`` spans a trace holds (the steps the schedule recorded)."""
    return sorted({int(e["name"].split("#")[1]) for e in _events(trace) if e["name"].startswith("ProfilerStep#")})


def top_ops(trace: Path, n: int = 8) -> list[tuple[str, float]]:
    """The ``n`` operators with the largest total duration (microseconds), profiler steps and autograd's engine
    wrappers aside: (name, total us), largest first."""
    totals = Counter()
    for e in _events(trace):
        if not e["name"].startswith(("ProfilerStep#", "autograd::engine", "PyTorch Profiler")):
            totals[e["name"]] += float(e.get("dur", 0))
    return totals.most_common(n)


def peak_tflops(name: str, precision: str) -> float | None:
    """The published dense peak of the card called ``name`` for ``precision`` ('no' = fp32), or None if unknown."""
    return next((p.get(precision) for prefix, p in PEAK_TFLOPS.items() if name.startswith(prefix)), None)


def attention_outcome(model, implementation: str, device: str) -> str:
    """``model``'s class rebuilt from its config with ``implementation`` and one forward pass on ``device``: "runs",
    or the error a learner would see (older transformers accept the name and fail at the first forward pass)."""
    import copy

    import torch

    try:
        rebuilt = type(model)._from_config(copy.deepcopy(model.config), attn_implementation=implementation)
        with torch.no_grad():
            rebuilt.to(device)(input_ids=torch.tensor([[1, 2, 3]], device=device))
        return "runs"
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc)[:120]}"
