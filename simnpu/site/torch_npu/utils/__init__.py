"""``torch_npu.utils`` of the simulated NPU: its one name a lesson reads (the CANN version); the rest of the real
module (format-combined tensors, FLOPs counter, thread affinity, async save) is a card's and is not simulated."""
__all__ = ["get_cann_version"]


def get_cann_version(module="CANN"):
    """The CANN version the real one reads from the toolkit; here the simulated one (torch.version.cann)."""
    import torch

    return torch.version.cann


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    raise AttributeError(f"torch_npu.utils.{name} is not simulated by the simulated NPU (it needs a real card)")
