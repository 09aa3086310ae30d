"""``torch_npu.contrib`` of the simulated NPU: only ``transfer_to_npu`` (import it explicitly, as with the real one).

The real package's fused functions and modules (``npu_iou``, ``ChannelShuffle``, ...) run Ascend kernels and are not
simulated, so this ``__all__`` is the real one less those names: empty.
"""

__all__ = []
