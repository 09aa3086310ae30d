"""Wire the simulated NPU into torch (imported by torch_npu/__init__.py)."""
import torch

# _runtime builds and loads the C++ guard/hooks; _tensor renames PrivateUse1 to "npu" and registers
# Python kernels (autocast, functional collectives); _hccl imports both first, so the order is always that one.
from . import _hccl, _ops, _runtime, _tensor  # noqa: F401


def finish(torch_npu):
    import torch_npu.npu as npu_module
    torch._register_device_module("npu", npu_module)
    torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True,
                                                         for_storage=True)
    torch.version.cann = _runtime.CANN_VERSION
    _hccl.register()
    from torch.utils.checkpoint import DefaultDeviceType
    DefaultDeviceType.set_device_type("npu")
    from . import _inductor

    _inductor.install()
