"""``torch.npu.amp`` of the simulated NPU: torch's own autocast and GradScaler for device 'npu'."""
import torch

__all__ = ["autocast", "GradScaler"]


class autocast(torch.amp.autocast_mode.autocast):
    def __init__(self, enabled=True, dtype=torch.float16, cache_enabled=True):
        super().__init__("npu", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


class GradScaler(torch.amp.GradScaler):
    # the real signature, `dynamic` included: dynamic=False keeps the scale fixed at init_scale
    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, dynamic=True, enabled=True):
        super().__init__("npu", init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval, enabled=enabled)
        self._dynamic = dynamic

    def update(self, new_scale=None):
        if new_scale is None and not self._dynamic and self.is_enabled():
            new_scale = self._init_scale  # static loss scaling: the scale never moves
        return super().update(new_scale)


del torch   # the real torch_npu.npu.amp does not bind the name `torch`
