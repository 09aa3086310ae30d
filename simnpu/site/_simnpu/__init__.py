"""Internals of the simulated Ascend NPU (the stand-in ``torch_npu``).

Kept outside the ``torch_npu`` package on purpose: ``torch_npu`` and ``torch.npu`` may only
define names the real torch_npu wheel defines (see simnpu/api/). Nothing here is public API.

``SIMNPU_TORCH_NPU`` picks the real release whose names and rules the stand-in presents:
``2.9.0.post2`` (default) or ``2.14.0``.
"""
import os

VERSIONS = ("2.9.0.post2", "2.14.0")
API_VERSION = os.environ.get("SIMNPU_TORCH_NPU") or VERSIONS[0]
if API_VERSION not in VERSIONS:
    raise ImportError(f"SIMNPU_TORCH_NPU={API_VERSION!r}: the simulated NPU presents torch_npu {' or '.join(VERSIONS)}")
NEW = API_VERSION != VERSIONS[0]   # 2.14.0's names and rules
