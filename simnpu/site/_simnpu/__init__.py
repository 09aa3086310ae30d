"""Internals of the simulated Ascend NPU (the stand-in ``torch_npu``).

Kept outside the ``torch_npu`` package on purpose: ``torch_npu`` and ``torch.npu`` may only
define names the real torch_npu wheel defines (see simnpu/api/). Nothing here is public API.

``SIMNPU_TORCH_NPU`` (or the dist-info first on the path) picks the real release whose names and rules the stand-in presents:
``2.9.0.post2`` (default) or ``2.14.0``.
"""
import os
from importlib import metadata

VERSIONS = ("2.9.0.post2", "2.14.0")
# The release: SIMNPU_TORCH_NPU, else the version of the torch_npu dist-info found first on the path (simnpu/site's
# says 2.9.0.post2; nbtools --torch-npu 2.14.0 puts simnpu/site-2.14.0's, which says 2.14.0, in front of it).
API_VERSION = os.environ.get("SIMNPU_TORCH_NPU") or metadata.version("torch_npu").split("+")[0]
if API_VERSION not in VERSIONS:
    raise ImportError(f"SIMNPU_TORCH_NPU={API_VERSION!r}: the simulated NPU presents torch_npu {' or '.join(VERSIONS)}")
NEW = API_VERSION != VERSIONS[0]   # 2.14.0's names and rules
