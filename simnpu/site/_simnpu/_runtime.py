"""Process-wide state of the simulated NPU, kept by its C++ part and read here through ctypes: visible
cards, current device, initialisation and the fork rule, the registry npu-smi reads, memory counts."""
import atexit
import ctypes
import os

import torch

from . import NEW, _build

LIB = _build.load()

SOCS = {
    # name: (HBM bytes, bf16 support)
    "Ascend910B4": (32 * 2**30, True),
    "Ascend910B3": (64 * 2**30, True),
    "Ascend910B2": (64 * 2**30, True),
    "Ascend910B1": (64 * 2**30, True),
    "Ascend310P3": (24 * 2**30, False),
}
SOC = os.environ.get("SIMNPU_SOC") or "Ascend910B4"
if SOC not in SOCS:
    raise RuntimeError(f"simulated NPU: SIMNPU_SOC={SOC!r} is not one of {sorted(SOCS)}")
HBM, BF16 = SOCS[SOC]
FAULT = os.environ.get("SIMNPU_FAULT", "")
CANN_VERSION = "9.1.0+simulated"  # the real torch_npu reports the CANN it loaded; this one loaded none


def status():
    return LIB.simnpu_status()


def device_count():
    return LIB.simnpu_device_count()


def current_device():
    return LIB.simnpu_current_device()


_ERR = ctypes.create_string_buffer(1024)


def _check(code):
    if code:
        raise RuntimeError(_ERR.value.decode())


def lazy_init():
    """Initialise the simulated runtime (what the first device use does on a real host); after a fork, and when
    the visible cards are wrong, raise the runtime's error."""
    _check(LIB.simnpu_touch(-1, _ERR, len(_ERR)))


def is_initialized():
    return bool(LIB.simnpu_initialized())


def in_bad_fork():
    return bool(LIB.simnpu_in_bad_fork())


def check_index(index):
    n = device_count()
    if index < 0 or index >= n:
        raise RuntimeError(f"Invalid device argument: npu:{index} (device_count={n}). "
                           "The device index is out of range.")


def touch(index):
    """Take card ``index`` in this process (initialises; registers it for npu-smi)."""
    _check(LIB.simnpu_touch(index, _ERR, len(_ERR)))


def set_device(index):
    _check(LIB.simnpu_set_device(index, _ERR, len(_ERR)))


# ---- npu-smi's registry: the C++ part writes <state dir>/procs/<pid>-<card> when a card is taken -------
def state_dir():
    return os.environ.get("SIMNPU_STATE_DIR") or f"/tmp/simnpu-{os.getuid()}"


def _unregister():
    folder = os.path.join(state_dir(), "procs")
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        if name.startswith(f"{os.getpid()}-"):
            try:
                os.unlink(os.path.join(folder, name))
            except OSError:
                pass


atexit.register(_unregister)


# ---- memory: the C++ allocator's counts per card ----------------------------------------------------------
MEMORY_FIELDS = ("allocated", "peak", "reserved", "peak_reserved", "allocs", "frees", "ooms", "allowed", "capacity",
                 "retries")


def memory(index):
    """The allocator's figures for card ``index`` (bytes and counts, as MEMORY_FIELDS names them)."""
    out = (ctypes.c_longlong * len(MEMORY_FIELDS))()
    LIB.simnpu_memory(index, out)
    return dict(zip(MEMORY_FIELDS, out))


def segments(index):
    """The reserved segments of card ``index``: (sizes, whether they are expandable, how many are the small pool's)."""
    out, flag, small = (ctypes.c_longlong * 64)(), ctypes.c_int(), ctypes.c_int()
    n = LIB.simnpu_segments(index, out, 64, ctypes.byref(flag), ctypes.byref(small))
    return list(out[:n]), bool(flag.value), small.value


LIB.simnpu_configure(SOC.encode(), HBM, int(BF16), int(NEW))
