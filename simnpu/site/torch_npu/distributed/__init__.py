"""``torch_npu.distributed`` of the simulated NPU: whether hccl is there (it is: simulated over gloo, see
_simnpu/_hccl.py). The rest of the real module (uneven collectives, reinit_process_group, rendezvous) is not
simulated."""
__all__ = ["is_available", "is_hccl_available"]


def is_available():
    import torch

    return torch.distributed.is_available()


def is_hccl_available():
    return is_available()


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    raise AttributeError(f"torch_npu.distributed.{name} is not simulated by the simulated NPU (it needs a real card)")
