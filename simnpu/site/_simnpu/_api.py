"""Functions of ``torch.npu`` for the simulated NPU. Names and parameters follow the real
torch_npu 2.9.0.post2, or 2.14.0 with SIMNPU_TORCH_NPU=2.14.0 (checked against simnpu/api/ by the tests)."""
import os
import time
import warnings

import torch

from . import NEW
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
    "get_device_capability", "set_per_process_memory_fraction", "get_per_process_memory_fraction",
    "memory_cached", "max_memory_cached", "reset_max_memory_cached", "reset_accumulated_memory_stats",
    "memory_stats_as_nested_dict", "memory_summary", "memory_snapshot",
    "set_autocast_enabled", "is_autocast_enabled", "set_autocast_dtype", "get_autocast_dtype",
    "get_allocator_backend", "caching_allocator_alloc", "caching_allocator_delete",
    "_set_rng_state_offset", "_get_rng_state_offset",
    "FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "LongTensor", "IntTensor", "ShortTensor",
    "CharTensor", "ByteTensor", "BoolTensor", "config",
] + (["set_task_queue_enable", "get_task_queue_enable"] if NEW else [])


def is_available():
    return rt.status() == 0 and rt.device_count() > 0


def device_count():
    return rt.device_count() if rt.status() == 0 else 0


def is_initialized():
    return rt.is_initialized()


def _lazy_init():
    rt.lazy_init()


def init():
    rt.lazy_init()


def _is_in_bad_fork():
    return rt.in_bad_fork()


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
        import uuid

        self.name = rt.SOC
        self.total_memory = rt.HBM
        self.index = index
        # invented, stable per simulated card (a card's comes from the driver)
        self.uuid = uuid.uuid5(uuid.NAMESPACE_OID, f"simnpu-{rt.SOC}-{rt.LIB.simnpu_physical_id(index)}")

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
    with globals()["device"](device):  # a device that is not an npu raises ValueError, as the real one
        pass


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


# ---- memory: the simulated caching allocator's counts (simnpu_tensor.cpp holds the rules) ------------------
def _idx(device):
    return current_device() if device is None else _get_device_index(device, optional=True)


def mem_get_info(device=None):
    """(free, total) bytes of the card: what this process holds reserved counts as used (other processes are not
    seen on the simulation)."""
    index = _idx(device)
    if index < 0 or index >= device_count():
        raise AssertionError("Invalid device id")
    rt.touch(index)
    m = rt.memory(index)
    return (m["capacity"] - m["reserved"], m["capacity"])


def set_per_process_memory_fraction(fraction, device=None):
    """Limit the caching allocator of ``device`` to ``fraction`` of the card's memory, as the real one does: an
    allocation past it raises torch.OutOfMemoryError."""
    rt.lazy_init()
    index = _idx(device)
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    if fraction < 0 or fraction > 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    rt.check_index(index)
    rt.LIB.simnpu_set_fraction(index, fraction)


def get_per_process_memory_fraction(device=None):
    return rt.LIB.simnpu_get_fraction(_idx(device))


def memory_allocated(device=None):
    return rt.memory(_idx(device))["allocated"]


def max_memory_allocated(device=None):
    return rt.memory(_idx(device))["peak"]


def memory_reserved(device=None):
    return rt.memory(_idx(device))["reserved"]


def max_memory_reserved(device=None):
    return rt.memory(_idx(device))["peak_reserved"]


def memory_cached(device=None):
    return memory_reserved(device)


def max_memory_cached(device=None):
    return max_memory_reserved(device)


def reset_peak_memory_stats(device=None):
    rt.LIB.simnpu_reset_peak(_idx(device))


def reset_max_memory_allocated(device=None):
    reset_peak_memory_stats(device)


def reset_max_memory_cached(device=None):
    reset_peak_memory_stats(device)


def reset_accumulated_memory_stats(device=None):
    rt.LIB.simnpu_reset_accumulated(_idx(device))


def memory_stats(device=None):
    """The real keys this simulation can fill (all pools together); the rest of the real dictionary is absent."""
    m = rt.memory(_idx(device))
    return {"allocated_bytes.all.current": m["allocated"], "allocated_bytes.all.peak": m["peak"],
            "allocation.all.allocated": m["allocs"], "allocation.all.freed": m["frees"],
            "allocation.all.current": m["allocs"] - m["frees"], "num_alloc_retries": m["retries"], "num_ooms": m["ooms"],
            "reserved_bytes.all.current": m["reserved"], "reserved_bytes.all.peak": m["peak_reserved"]}


def memory_stats_as_nested_dict(device=None):
    out = {}
    for key, value in memory_stats(device).items():
        node = out
        *path, last = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return out


def _format_size(n):  # the real memory_summary's sizes
    for prefix in ["B ", "KB", "MB", "GB", "TB"]:
        if abs(n) < 768 * 1024:
            break
        n //= 1024
    return f"{n:7d} {prefix}"


def memory_summary(device=None, abbreviated=False):
    """The real layout's header and its rows this simulation fills (all pools together)."""
    index = _idx(device)
    m = rt.memory(index)
    line, rule = "|" + "=" * 75 + "|", "|" + "-" * 75 + "|"
    rows = [("Allocated memory", _format_size(m["allocated"]), _format_size(m["peak"])),
            ("NPU reserved memory", _format_size(m["reserved"]), _format_size(m["peak_reserved"])),
            ("Allocations", f"{m['allocs'] - m['frees']:7d}  ", "")]
    out = [line, "|" + f"PyTorch NPU memory summary, device ID {index}".center(75) + "|", rule,
           "|" + f"NPU OOMs: {m['ooms']}".center(36) + "|" + "npuMalloc retries: 0".center(38) + "|", line,
           "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |", rule]
    for name, cur, peak in rows:
        out.append(f"| {name:<22}| {cur} | {peak:<10} | {'':<10} | {'':<10} |")
    out.append(line)
    return "\n".join(out) + "\n"


def _snapshot_all():
    """The real segment dicts (Module.cpp segmentInfoToDict), one per reserved segment of each card: sizes, pool
    (``segment_type``) and ``is_expandable`` (expandable_segments:True) as the allocator here holds them; each
    segment's allocated bytes are the card's, filled into its segments in order; addresses are invented."""
    out = []
    for index in range(device_count()):
        sizes, expandable, small = rt.segments(index)
        left = rt.memory(index)["allocated"]
        address = 0x12C0000000 + (index << 36)
        for i, size in enumerate(sizes):
            used, left = min(size, left), left - min(size, left)
            blocks = [{"address": address, "size": used, "requested_size": used, "state": "active_allocated",
                       "frames": []}] if used else []
            if size > used:
                blocks.append({"address": address + used, "size": size - used, "requested_size": 0,
                               "state": "inactive", "frames": []})
            out.append({"device": index, "address": address, "total_size": size, "allocated_size": used,
                        "active_size": used, "requested_size": used, "stream": 0, "segment_pool_id": (0, 0),
                        "segment_type": "small" if i < small else "large", "is_expandable": expandable,
                        "frames": [], "blocks": blocks})
            address += size
    return out


def memory_snapshot():  # 2.14.0's takes mempool_id=None (below)
    return _snapshot_all()


def empty_cache():
    for index in range(device_count()):
        rt.LIB.simnpu_empty_cache(index)


# ---- RNG: one generator per card (C++; random kernels of npu tensors draw from it) -----------------------
def _gen_index(device="npu"):
    if device in ("npu", None):
        return rt.current_device()
    return _get_device_index(device, optional=True)


def manual_seed(seed):
    rt.LIB.simnpu_manual_seed(rt.current_device(), int(seed) & (2**64 - 1))


def manual_seed_all(seed):
    for index in range(max(device_count(), 1)):
        rt.LIB.simnpu_manual_seed(index, int(seed) & (2**64 - 1))


def seed():
    rt.LIB.simnpu_seed(rt.current_device())


def seed_all():
    value = rt.LIB.simnpu_seed(rt.current_device())
    manual_seed_all(value)


def initial_seed():
    return rt.LIB.simnpu_initial_seed(rt.current_device())


def get_rng_state(device="npu"):
    index = _gen_index(device)
    state = torch.empty(rt.LIB.simnpu_get_rng_state(index, None, 0), dtype=torch.uint8)
    rt.LIB.simnpu_get_rng_state(index, state.data_ptr(), state.numel())
    return state


def set_rng_state(new_state, device="npu"):
    state = new_state.to("cpu", torch.uint8).contiguous()
    rt.LIB.simnpu_set_rng_state(_gen_index(device), state.data_ptr(), state.numel())


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
# Built on torch's generic Stream / Event through the C++ guard: new streams come from a pool per card (as the real
# ones), the current stream is kept per card and thread, and events record the host time (elapsed_time works).
class Stream(torch.Stream):
    def __new__(cls, device=None, priority=0, **kwargs):
        if kwargs:  # stream_id / device_index / device_type: an existing stream, as current_stream() builds
            return super().__new__(cls, priority=priority, **kwargs)
        index = _get_device_index(device, optional=True)
        return super().__new__(cls, device=torch.device("npu", index), priority=priority)

    @property
    def npu_stream(self):
        """An invented handle (a card's is an aclrtStream pointer): distinct per card and stream, never 0."""
        return 0x10000000 + (self.device_index << 20) + (self.stream_id << 8)

    def __repr__(self):
        return f"<torch_npu.npu.Stream device={self.device} npu_stream={self.npu_stream:#x}>"

    def wait_event(self, event):
        event.wait(self)

    def record_event(self, event=None):
        if event is None:
            event = Event()
        event.record(self)
        return event


class Event(torch.Event):
    def __new__(cls, enable_timing=False, blocking=False, interprocess=False):
        return super().__new__(cls, device=torch.device("npu", rt.current_device()), enable_timing=enable_timing,
                               blocking=blocking, interprocess=interprocess)

    def record(self, stream=None):
        super().record(current_stream() if stream is None else stream)
        self._host_ms = time.perf_counter() * 1000.0

    @property
    def npu_event(self):
        """An invented handle once recorded (a card's is an aclrtEvent pointer), 0 before, as the real one."""
        return 0 if getattr(self, "_host_ms", None) is None else 0x20000000 + (id(self) & 0xFFFFFF) * 16

    def __repr__(self):
        return f"<torch_npu.npu.Event {self.npu_event:#x}>" if self.npu_event else "<torch_npu.npu.Event uninitialized>"

    def elapsed_time(self, end_event):
        """Milliseconds between the two records on the host (torch's C++ check takes only its own Event type)."""
        start, end = getattr(self, "_host_ms", None), getattr(end_event, "_host_ms", None)
        if start is None or end is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return end - start


def _as_npu_stream(s):
    return Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)


def current_stream(device=None):
    rt.lazy_init()
    return _as_npu_stream(torch.accelerator.current_stream(_get_device_index(device, optional=True)))


def default_stream(device=None):
    rt.lazy_init()
    index = _get_device_index(device, optional=True)
    return Stream(stream_id=0, device_index=index, device_type=torch.accelerator.current_stream(index).device_type)


def set_stream(stream):
    if stream is None:
        return
    torch.accelerator.set_stream(stream)


class StreamContext:
    """Selects ``stream_ctx`` and its card while the block runs (a no-op for None), as the real one."""

    def __init__(self, stream_ctx):
        self.stream = stream_ctx
        self.prev = self.prev_device = None

    def __enter__(self):
        if self.stream is not None:
            self.prev_device = rt.current_device()
            self.prev = current_stream(self.stream.device_index)
            if self.stream.device_index != self.prev_device:
                rt.set_device(self.stream.device_index)
            set_stream(self.stream)

    def __exit__(self, *exc):
        if self.stream is not None:
            set_stream(self.prev)
            rt.set_device(self.prev_device)
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
    import re

    match = re.fullmatch(r"(\d+)\.(\d+)", value)
    if not match:
        warnings.warn("torch.npu.get_device_capability can't parse TORCH_NPU_DEVICE_CAPABILITY environment variable: "
                      f"{value}. Expected format is 'major.minor' where major and minor are non-negative integers "
                      "(e.g., '8.0').")
        return None
    warnings.warn("You can set the device capability via the environment variable TORCH_NPU_DEVICE_CAPABILITY. "
                  "The return value of get_device_capability is only for compatibility with PyTorch and does not "
                  "represent the actual capability of the NPU device.")
    return int(match.group(1)), int(match.group(2))


# ---- autocast switches of torch.npu (torch's own, for device "npu") ------------------------------------------------
def set_autocast_enabled(enable):
    torch.set_autocast_enabled("npu", enable)


def is_autocast_enabled():
    return torch.is_autocast_enabled("npu")


def set_autocast_dtype(dtype):
    torch.set_autocast_dtype("npu", dtype)


def get_autocast_dtype():
    return torch.get_autocast_dtype("npu")


# ---- the caching allocator's raw interface -----------------------------------------------------------------------
_RAW = {}   # pointer -> the npu tensor that holds its bytes (counted by the allocator like any other)


def get_allocator_backend():
    return "native"   # the real one's name for its caching allocator (no pluggable allocator is simulated)


def caching_allocator_alloc(size, device=None, stream=None):
    index = _get_device_index(device, optional=True)
    t = torch.empty(int(size), dtype=torch.uint8, device=torch.device("npu", index))
    _RAW[t.data_ptr()] = t
    return t.data_ptr()


def caching_allocator_delete(mem_ptr):
    if _RAW.pop(mem_ptr, None) is None:
        raise RuntimeError(f"invalid device pointer: {mem_ptr:#x}")


# ---- what only a card's Philox generator has ---------------------------------------------------------------------
def _set_rng_state_offset(offset, device="npu"):
    raise NotImplementedError("torch.npu._set_rng_state_offset is not simulated: the simulated NPU's generator is "
                              "the CPU's Mersenne Twister, which has no Philox offset (a real card's has)")


def _get_rng_state_offset(device="npu"):
    raise NotImplementedError("torch.npu._get_rng_state_offset is not simulated: the simulated NPU's generator is "
                              "the CPU's Mersenne Twister, which has no Philox offset (a real card's has)")


# ---- the legacy tensor types (torch.npu.FloatTensor, ...) ----------------------------------------------------------
class _LegacyTensorType(type):
    """``torch.npu.FloatTensor(2, 3)`` / ``(data)`` makes an npu tensor of that dtype on the current card, and
    ``isinstance(t, torch.npu.FloatTensor)`` holds for npu tensors of that dtype, as the real types do."""

    def __instancecheck__(cls, obj):
        return isinstance(obj, torch.Tensor) and obj.device.type == "npu" and obj.dtype == cls.dtype

    def __call__(cls, *args, device=None):
        where = torch.device("npu", _get_device_index(device, optional=True))
        if len(args) == 1 and isinstance(args[0], (list, tuple, torch.Tensor)) and not (
                isinstance(args[0], tuple) and all(isinstance(a, int) for a in args[0])):
            return torch.as_tensor(args[0], dtype=cls.dtype).to(where)
        size = args[0] if len(args) == 1 and isinstance(args[0], (tuple, torch.Size)) else args
        return torch.empty(size, dtype=cls.dtype, device=where)


def _legacy(name, dtype):
    return _LegacyTensorType(name, (), {"dtype": dtype, "is_sparse": False, "__module__": "torch.npu"})


FloatTensor = _legacy("FloatTensor", torch.float32)
DoubleTensor = _legacy("DoubleTensor", torch.float64)
HalfTensor = _legacy("HalfTensor", torch.float16)
BFloat16Tensor = _legacy("BFloat16Tensor", torch.bfloat16)
LongTensor = _legacy("LongTensor", torch.int64)
IntTensor = _legacy("IntTensor", torch.int32)
ShortTensor = _legacy("ShortTensor", torch.int16)
CharTensor = _legacy("CharTensor", torch.int8)
ByteTensor = _legacy("ByteTensor", torch.uint8)
BoolTensor = _legacy("BoolTensor", torch.bool)


class _npuConfig:  # the real class name (its AttributeError names it)
    """``torch.npu.config`` as the real ``npu_config._npuConfig()``: setting ``allow_internal_format`` is an option
    of the card's runtime (internal formats: see simnpu/README.md), so it changes nothing here; the real one ignores
    other names too, and stores nothing (reading an attribute raises AttributeError there, as here)."""

    def __setattr__(self, name, value):
        pass


config = _npuConfig()


if NEW:   # torch_npu 2.14.0's names and parameters
    def memory_snapshot(mempool_id=None):  # noqa: F811
        if mempool_id is not None:
            raise NotImplementedError("torch.npu.memory_snapshot(mempool_id=...): memory pools are not simulated by "
                                      "the simulated NPU")
        return _snapshot_all()

    def is_bf16_supported(including_emulation=False):  # noqa: F811  (the real one ignores the argument too)
        rt.lazy_init()
        return rt.BF16

    _task_queue = []   # the mode set by set_task_queue_enable, else read from the environment at the first ask

    def set_task_queue_enable(mode):
        """As the real one: 0, 1 or 2 (a str is converted), else RuntimeError. Kernels run synchronously here, so
        the mode changes nothing but what get_task_queue_enable answers."""
        if isinstance(mode, str):
            mode = int(mode)
        if mode not in (0, 1, 2):
            raise RuntimeError(f"mode must be 0, 1, or 2, but got {mode}.")
        _task_queue[:] = [mode]

    def get_task_queue_enable():
        """The effective mode: 0 under ASCEND_LAUNCH_BLOCKING=1, else the one set, else TASK_QUEUE_ENABLE (1 when
        unset or not 0/1/2)."""
        if os.environ.get("ASCEND_LAUNCH_BLOCKING") == "1":
            return 0
        if not _task_queue:
            value = os.environ.get("TASK_QUEUE_ENABLE", "1")
            _task_queue.append(int(value) if value in ("0", "1", "2") else 1)
        return _task_queue[0]
