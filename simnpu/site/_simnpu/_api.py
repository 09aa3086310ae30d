"""Functions of ``torch.npu`` for the simulated NPU. Names and parameters follow the real
torch_npu 2.9.0.post2 (checked against simnpu/api/torch_npu-2.9.0.post2.json by the tests)."""
import os
import warnings

import torch

from . import _runtime as rt

__all__ = [
    "is_available", "device_count", "current_device", "set_device", "get_device_name",
    "get_device_properties", "synchronize", "is_initialized", "init", "_lazy_init",
    "_is_in_bad_fork", "_get_device_index", "device", "device_of", "mem_get_info",
    "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
    "reset_peak_memory_stats", "reset_max_memory_allocated", "empty_cache", "memory_stats",
    "manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed", "get_rng_state",
    "set_rng_state", "get_rng_state_all", "set_rng_state_all", "is_bf16_supported",
    "get_amp_supported_dtype", "set_compile_mode", "is_jit_compile_false", "matmul",
    "Stream", "Event", "StreamContext", "stream", "set_stream", "current_stream", "default_stream",
    "get_device_capability",
]


def is_available():
    return rt.status() == 0 and rt.device_count() > 0


def device_count():
    return rt.device_count() if rt.status() == 0 else 0


def is_initialized():
    return rt.initialized and not rt.in_bad_fork


def _lazy_init():
    rt.lazy_init()


def init():
    rt.lazy_init()


def _is_in_bad_fork():
    return rt.in_bad_fork


def _get_device_index(device, optional=False, allow_cpu=False):
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if allow_cpu and device.type == "cpu":
            return -1
        if device.type != "npu":
            raise ValueError(f"Expected a npu device, but got: {device}")
        index = device.index
    elif isinstance(device, int):
        index = device
    elif device is None:
        index = None
    else:
        raise ValueError(f"Expected a npu device, but got: {device!r}")
    if index is None:
        if not optional:
            raise ValueError(f"Expected a npu device with a specified index or an integer, but got: {device}")
        index = rt.current_device()
    return index


def current_device():
    rt.lazy_init()
    return rt.current_device()


def set_device(device):
    index = _get_device_index(device, optional=True)
    if index >= 0:
        rt.set_device(index)


def get_device_name(device_name=None):
    rt.lazy_init()  # the real one initialises the NPU here (after a fork: "Cannot re-initialize NPU")
    index = _get_device_index(device_name, optional=True)
    if index < 0 or index >= device_count():
        raise AssertionError("Invalid device id")
    return rt.SOC


class _Properties:
    def __init__(self, index):
        self.name = rt.SOC
        self.total_memory = rt.HBM
        self.index = index

    def __repr__(self):
        return f"_NPUDeviceProperties(name='{self.name}', total_memory={self.total_memory // 2**20}MB)"


def get_device_properties(device_name=None):
    rt.lazy_init()
    index = _get_device_index(device_name, optional=True)
    if index < 0 or index >= device_count():
        raise AssertionError("Invalid device id")
    return _Properties(index)


def synchronize(device=None):
    rt.lazy_init()


class device:
    """Context manager that changes the current device (like ``torch.npu.device``)."""

    def __init__(self, device):
        self.idx = _get_device_index(device, optional=True)
        self.prev_idx = -1

    def __enter__(self):
        if self.idx == -1:
            return
        self.prev_idx = rt.current_device()
        if self.prev_idx != self.idx:
            rt.set_device(self.idx)

    def __exit__(self, *exc):
        if self.prev_idx != self.idx and self.idx != -1:
            rt.set_device(self.prev_idx)
        return False


class device_of(device):
    def __init__(self, obj):
        idx = obj.get_device() if getattr(obj, "device", None) is not None and obj.device.type == "npu" else -1
        super().__init__(idx)


# ---- memory: bytes of live npu tensors' storages (host memory in this simulation) --------------
def _idx(device):
    return _get_device_index(device, optional=True)


def mem_get_info(device=None):
    if device is None:
        device = current_device()
    index = _idx(device)
    rt.touch(index)
    total = rt.HBM
    return (total - rt.allocated.get(index, 0), total)


def memory_allocated(device=None):
    return rt.allocated.get(_idx(device), 0)


def max_memory_allocated(device=None):
    return rt.peak.get(_idx(device), 0)


def _round(n):
    block = 2 * 2**20
    return -(-n // block) * block


def memory_reserved(device=None):
    return _round(memory_allocated(device))


def max_memory_reserved(device=None):
    return _round(max_memory_allocated(device))


def reset_peak_memory_stats(device=None):
    index = _idx(device)
    rt.peak[index] = rt.allocated.get(index, 0)


def reset_max_memory_allocated(device=None):
    reset_peak_memory_stats(device)


def memory_stats(device=None):
    index = _idx(device)
    a, p = rt.allocated.get(index, 0), rt.peak.get(index, 0)
    return {"allocated_bytes.all.current": a, "allocated_bytes.all.peak": p,
            "reserved_bytes.all.current": _round(a), "reserved_bytes.all.peak": _round(p)}


def empty_cache():
    pass


# ---- RNG: one generator per device (host generators the npu tensors' random kernels draw from) ---
def _gen(device="npu"):
    index = rt.current_device() if device in ("npu", None) else _get_device_index(device, optional=True)
    return rt.generator(index)


def manual_seed(seed):
    _gen().manual_seed(int(seed))


def manual_seed_all(seed):
    for index in range(max(device_count(), 1)):
        rt.generator(index).manual_seed(int(seed))


def seed():
    _gen().seed()


def seed_all():
    value = _gen().seed()
    manual_seed_all(value)


def initial_seed():
    return _gen().initial_seed()


def get_rng_state(device="npu"):
    return _gen(device).get_state()


def set_rng_state(new_state, device="npu"):
    _gen(device).set_state(new_state)


def get_rng_state_all():
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(new_states):
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


# ---- dtypes and compile mode ------------------------------------------------------------------
def is_bf16_supported():
    rt.lazy_init()
    return rt.BF16


def get_amp_supported_dtype():
    if is_bf16_supported():
        return [torch.float16, torch.bfloat16, torch.float32]
    return [torch.float16, torch.float32]


# torch_npu's default: binary operators (jit_compile off) on Atlas A2 training cards (910B), online compiling on others
_jit_compile = [not rt.SOC.startswith("Ascend910B")]


def set_compile_mode(jit_compile=False):
    _jit_compile[0] = bool(jit_compile)


def is_jit_compile_false():
    rt.lazy_init()
    return not _jit_compile[0]


class _Matmul:
    """``torch.npu.matmul``: ``allow_hf32`` lets float32 matmuls use HF32 on a card (off by default). The
    simulation computes float32 on the CPU whatever it says: a setting to read and write, no effect."""

    def __init__(self):
        self.allow_hf32 = False


matmul = _Matmul()


# ---- streams and events: every kernel runs synchronously on the host, so they order nothing -------
# Built on torch's generic Stream / Event (through the C++ guard, whose stream and event hooks are
# no-ops), so code that hands them to C++ (record_stream, FSDP2's all-gather streams) gets real ones.
class Stream(torch.Stream):
    def __new__(cls, device=None, priority=0, **kwargs):
        if kwargs:  # stream_id / device_index / device_type: an existing stream, as current_stream() builds
            return super().__new__(cls, priority=priority, **kwargs)
        index = _get_device_index(device, optional=True)
        return super().__new__(cls, device=torch.device("npu", index), priority=priority)

    def wait_event(self, event):
        event.wait(self)


class Event(torch.Event):
    def __new__(cls, enable_timing=False, blocking=False, interprocess=False):
        return super().__new__(cls, device=torch.device("npu", rt.current_device()), enable_timing=enable_timing,
                               blocking=blocking, interprocess=interprocess)


_current_streams = {}  # device index -> the stream set_stream() selected


def _as_npu_stream(s):
    return Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)


def current_stream(device=None):
    rt.lazy_init()
    index = _get_device_index(device, optional=True)
    return _current_streams.get(index) or default_stream(index)


def default_stream(device=None):
    rt.lazy_init()
    return _as_npu_stream(torch.accelerator.current_stream(_get_device_index(device, optional=True)))


def set_stream(stream):
    if stream is None:
        return
    _current_streams[stream.device_index] = stream


class StreamContext:
    """Selects ``stream_ctx`` on its device while the block runs (a no-op for None), as the real one."""

    def __init__(self, stream_ctx):
        self.stream = stream_ctx
        self.prev = None

    def __enter__(self):
        if self.stream is not None:
            self.prev = current_stream(self.stream.device_index)
            set_stream(self.stream)

    def __exit__(self, *exc):
        if self.stream is not None:
            set_stream(self.prev)
        return False


def stream(stream):
    return StreamContext(stream)


def get_device_capability(device=None):
    """None unless TORCH_NPU_DEVICE_CAPABILITY="major.minor" is set, as the real one (it says so in a warning)."""
    value = os.getenv("TORCH_NPU_DEVICE_CAPABILITY")
    if not value:
        warnings.warn("You can set the device capability via the environment variable TORCH_NPU_DEVICE_CAPABILITY. "
                      "The return value of get_device_capability is only for compatibility with PyTorch and does not "
                      "represent the actual capability of the NPU device.")
        return None
    major, minor = value.split(".")
    return int(major), int(minor)
