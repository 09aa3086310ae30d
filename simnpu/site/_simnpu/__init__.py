"""Internals of the simulated Ascend NPU (the stand-in ``torch_npu``).

Kept outside the ``torch_npu`` package on purpose: ``torch_npu`` and ``torch.npu`` may only
define names the real torch_npu wheel defines (see simnpu/api/). Nothing here is public API.
"""
