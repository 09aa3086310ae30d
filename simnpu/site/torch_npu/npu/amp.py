"""``torch.npu.amp`` of the simulated NPU: torch's own autocast and GradScaler for device 'npu'."""
import torch

__all__ = ["autocast", "GradScaler"]


class autocast(torch.amp.autocast_mode.autocast):
    def __init__(self, enabled=True, dtype=torch.float16, cache_enabled=True):
        super().__init__("npu", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


class GradScaler(torch.amp.GradScaler):
    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, enabled=True):
        super().__init__("npu", init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval, enabled=enabled)


del torch   # the real torch_npu.npu.amp does not bind the name `torch`
