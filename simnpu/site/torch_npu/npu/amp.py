"""``torch.npu.amp`` of the simulated NPU: torch's own autocast and GradScaler for device 'npu'."""
import torch

__all__ = ["autocast", "GradScaler", "custom_fwd", "custom_bwd"]


def custom_fwd(fwd=None, *, cast_inputs=None):
    """torch.amp.custom_fwd for device "npu" (what the real torch.npu.amp.custom_fwd is)."""
    import torch  # the module does not bind the name, as the real one

    return torch.amp.custom_fwd(fwd, device_type="npu", cast_inputs=cast_inputs)


def custom_bwd(bwd):
    import torch

    return torch.amp.custom_bwd(bwd, device_type="npu")


class autocast(torch.amp.autocast_mode.autocast):
    def __init__(self, enabled=True, dtype=torch.float16, cache_enabled=True):
        super().__init__("npu", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


class GradScaler(torch.amp.GradScaler):
    """torch's GradScaler with the real torch_npu one's rules: outputs must be npu tensors, and one overflow flag
    per iteration: once an optimizer's gradients overflow, every later optimizer of that iteration skips its step
    too (torch's own scaler decides per optimizer). The real one all-reduces that flag across ranks only on cards
    that cannot report inf/nan (not on 910B), so this one does not."""

    # the real signature, `dynamic` included: dynamic=False keeps the scale fixed at init_scale
    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, dynamic=True, enabled=True):
        super().__init__("npu", init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval, enabled=enabled)
        self._dynamic = dynamic
        self._has_overflow = False

    def scale(self, outputs):
        import torch  # the module does not bind the name, as the real one

        if self.is_enabled():
            if isinstance(outputs, torch.Tensor):
                if outputs.device.type != "npu":
                    raise ValueError("Device type of outputs should be npu.")
            elif isinstance(outputs, (list, tuple)):
                for val in outputs:
                    if isinstance(val, torch.Tensor) and val.device.type != "npu":
                        raise ValueError("Device type of val should be npu.")
        return super().scale(outputs)

    def _unscale_grads_(self, optimizer, inv_scale, found_inf, allow_fp16):
        per_device_found_inf = super()._unscale_grads_(optimizer, inv_scale, found_inf, allow_fp16)
        if any(v.item() > 0 for v in per_device_found_inf.values()):
            self._has_overflow = True
        if self._has_overflow:
            for v in per_device_found_inf.values():
                v.add_(1)
        return per_device_found_inf

    def _maybe_opt_step(self, optimizer, optimizer_state, *args, **kwargs):
        if self._has_overflow:
            return None
        return super()._maybe_opt_step(optimizer, optimizer_state, *args, **kwargs)

    def update(self, new_scale=None):
        if new_scale is None and not self._dynamic and self.is_enabled():
            new_scale = self._init_scale  # static loss scaling: the scale never moves
        try:
            return super().update(new_scale)
        finally:
            self._has_overflow = False


del torch   # the real torch_npu.npu.amp does not bind the name `torch`
