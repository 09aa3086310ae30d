"""Simulated torch_npu: an Ascend NPU backend that runs on the CPU (see simnpu/README.md).

``torch_npu.__version__`` carries the local label ``+simulated``; that label is the one way to
tell this stand-in from the real torch_npu. It defines only names the real torch_npu 2.9.0.post2 (or 2.14.0)
defines; its machinery lives in the private package ``_simnpu`` beside it.
"""
__all__ = ["erase_stream"]   # the real one's, less HiFloat8Tensor and matmul_checksum (not simulated)

import os
import sys

# As the real torch_npu: torch's backend autoload is off while `import torch` runs here, so `import torch_npu` before
# torch does not import torch_npu again from torch's entry point (a circular import); _autoload restores it.
ORG_AUTOLOAD = os.getenv("TORCH_DEVICE_BACKEND_AUTOLOAD", "1")
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

import torch  # noqa: E402

# The real torch_npu refuses to share a process with another accelerator backend.
if torch._C._get_accelerator().type not in ("cpu", "privateuseone", "npu"):
    raise RuntimeError(
        "Two accelerators cannot be used at the same time in PyTorch: npu and "
        f"{torch._C._get_accelerator().type}. You can install the cpu version of PyTorch to use your "
        f"npu device, or use the {torch._C._get_accelerator().type} device with "
        "'export TORCH_DEVICE_BACKEND_AUTOLOAD=0'.")

__import__("_simnpu._boot")          # build/load the C++ part, register device, hccl, ...

_C = sys.modules["torch_npu._C"] = sys.modules["_simnpu._ops"].c_extension()

import torch_npu.distributed  # noqa: E402,F401
import torch_npu.npu  # noqa: E402,F401  (binds torch_npu.npu)
import torch_npu.utils  # noqa: E402,F401
from torch_npu.version import __version__ as __version__  # noqa: E402


# torch.ops.npu operators, bound here as the real torch_npu binds every one of them (_simnpu/_ops.py)
get_npu_format = torch.ops.npu.get_npu_format
npu_format_cast = torch.ops.npu.npu_format_cast
npu_format_cast_ = torch.ops.npu.npu_format_cast_
empty_with_format = torch.ops.npu.empty_with_format
npu_prompt_flash_attention = torch.ops.npu.npu_prompt_flash_attention


def erase_stream(tensor, stream):
    """Undo ``tensor.record_stream(stream)``: streams order nothing here (kernels run on the host), so nothing."""


def npu_fusion_attention(*args, **kwargs):
    raise NotImplementedError(
        "npu_fusion_attention (Ascend's fused attention kernel) is not available on the simulated NPU")


sys.modules["_simnpu._boot"].finish(sys.modules[__name__])


# Entry point torch calls on 'import torch' (torch.backends entry point), as in the real wheel.
def _autoload():
    # the real one's words: "We should restore this switch as sub processes need to inherit its value"
    os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = ORG_AUTOLOAD


if sys.modules["_simnpu"].NEW:   # 2.14.0 restores the switch when `import torch_npu` came first, too
    _autoload()
    del sys   # and binds no `sys`
