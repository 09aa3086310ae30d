"""``torch.npu`` of the simulated NPU. Only names the real torch_npu.npu defines."""
import torch  # noqa: F401  (the real torch_npu.npu binds it too)
from _simnpu import NEW as _new
from _simnpu._api import *  # noqa: F401,F403
from _simnpu._api import (  # noqa: F401
    _get_device_index,
    _get_rng_state_offset,
    _is_in_bad_fork,
    _lazy_init,
    _set_rng_state_offset,
)

from . import amp, random  # noqa: F401

# The real torch_npu.npu's __all__ (simnpu/api/), less the names this stand-in does not define.
__all__ = [
    "BFloat16Tensor", "BoolTensor", "ByteTensor", "CharTensor", "DoubleTensor", "FloatTensor", "HalfTensor",
    "IntTensor", "LongTensor", "ShortTensor", "caching_allocator_alloc", "caching_allocator_delete",
    "get_allocator_backend", "get_autocast_dtype", "is_autocast_enabled", "set_autocast_dtype", "set_autocast_enabled",
    "Event", "Stream", "StreamContext", "current_device", "current_stream", "default_stream", "device",
    "device_count", "device_of", "empty_cache", "get_amp_supported_dtype", "get_device_capability",
    "get_device_name", "get_device_properties", "get_per_process_memory_fraction", "get_rng_state",
    "get_rng_state_all", "init", "initial_seed", "is_available", "is_bf16_supported", "is_initialized",
    "is_jit_compile_false", "manual_seed", "manual_seed_all", "matmul", "max_memory_allocated", "max_memory_cached",
    "max_memory_reserved", "mem_get_info", "memory_allocated", "memory_cached", "memory_reserved",
    "memory_snapshot", "memory_stats", "memory_stats_as_nested_dict", "memory_summary",
    "reset_accumulated_memory_stats", "reset_max_memory_allocated", "reset_max_memory_cached",
    "reset_peak_memory_stats", "seed", "seed_all", "set_compile_mode", "set_device",
    "set_per_process_memory_fraction", "set_rng_state", "set_rng_state_all", "set_stream", "stream", "synchronize",
    "config",
] + (["set_task_queue_enable", "get_task_queue_enable"] if _new else [])
del _new
