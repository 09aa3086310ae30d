"""``torch.npu`` of the simulated NPU. Only names the real torch_npu.npu defines."""
import torch  # noqa: F401  (the real torch_npu.npu binds it too)
from _simnpu._api import *  # noqa: F401,F403
from _simnpu._api import _get_device_index, _is_in_bad_fork, _lazy_init  # noqa: F401

from . import amp, random  # noqa: F401
