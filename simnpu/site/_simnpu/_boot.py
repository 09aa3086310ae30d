"""Wire the simulated NPU into torch (imported by torch_npu/__init__.py)."""
import builtins
import os
import sys
import warnings

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
    interactive_task_queue()


# The real words of each release (2.9.0.post2 torch_npu/__init__.py, 2.14.0 torch_npu/_init/core/optional_features.py)
TASK_QUEUE_WARNING = {
    "2.9.0.post2": "On the interactive interface, the value of TASK_QUEUE_ENABLE is set to 0 by default. "
                   "                     Do not set it to 1 to prevent some unknown errors",
    "2.14.0": "On the interactive interface, the value of TASK_QUEUE_ENABLE is set to 0 by default. "
              "Do not set it to 1 to avoid unexpected errors.",
}


def interactive_task_queue():
    """As both real releases at the end of their import: in an interactive interpreter (``sys.ps1``, IPython /
    Jupyter's ``__IPYTHON__``, ``python -i``) TASK_QUEUE_ENABLE is set to "0", overwriting any value the user set,
    with a UserWarning; child processes inherit it. Elsewhere it is left as it is."""
    from . import API_VERSION
    if hasattr(sys, "ps1") or hasattr(builtins, "__IPYTHON__") or sys.flags.interactive:
        os.environ["TASK_QUEUE_ENABLE"] = "0"
        warnings.warn(TASK_QUEUE_WARNING[API_VERSION], stacklevel=3)
