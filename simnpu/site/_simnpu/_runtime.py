"""Process-wide state of the simulated NPU: visible cards, current device, initialisation and
the fork rule, the process registry npu-smi reads, and memory accounting."""
import atexit
import os
import sys
import threading

import torch

from . import _build

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


def physical_id(i):
    return LIB.simnpu_physical_id(i)


def current_device():
    return LIB.simnpu_current_device()


# One generator per device, as a card has (torch_npu seeds a fresh one with c10's default seed, as CUDA does).
DEFAULT_SEED = 67280421310721
_generators = {}


def generator(index):
    """The npu:``index`` generator: random kernels of npu tensors draw from it, not from the CPU's."""
    if index not in _generators:
        _generators[index] = torch.Generator().manual_seed(DEFAULT_SEED)
    return _generators[index]


_lock = threading.RLock()
initialized = False
in_bad_fork = False
_cards_held = set()


def _fail_status():
    st = status()
    vis = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
    if st == 207004:
        raise RuntimeError(
            "npuSynchronizeDevice:torch_npu/csrc/core/npu/NPUStream.cpp NPU function error: "
            f"aclrtSetDevice, error code is 207004\n[ERROR] (simulated) ASCEND_RT_VISIBLE_DEVICES={vis} "
            f"names a card the host does not have (SIMNPU_CARDS={os.environ.get('SIMNPU_CARDS', '2')}). "
            "EE1001: The argument is invalid.")
    if st != 0:
        raise RuntimeError(f"NPU device is unavailable: ASCEND_RT_VISIBLE_DEVICES={vis} is not an "
                           "ascending list of card ids (simulated runtime rejects it)")


def lazy_init():
    """Initialise the simulated runtime (what the first device use does on a real host)."""
    global initialized
    if initialized and not in_bad_fork:
        return
    if in_bad_fork:
        raise RuntimeError(
            "Cannot re-initialize NPU in forked subprocess. To use NPU with multiprocessing, "
            "you must use the 'spawn' start method")
    with _lock:
        if initialized:
            return
        _fail_status()
        if device_count() == 0:
            raise RuntimeError("No NPU device is visible (simulated runtime: device_count() == 0)")
        LIB.simnpu_freeze()  # ASCEND_RT_VISIBLE_DEVICES was re-read until now; from here the cards are fixed
        initialized = True


def check_index(index):
    n = device_count()
    if index < 0 or index >= n:
        raise RuntimeError(f"Invalid device argument: npu:{index} (device_count={n}). "
                           "The device index is out of range.")


def touch(index):
    """Mark card ``index`` as used by this process (initialises; registers for npu-smi)."""
    if initialized and index in _cards_held and not in_bad_fork:
        return
    lazy_init()
    check_index(index)
    if index not in _cards_held:
        _cards_held.add(index)
        _register(physical_id(index))


def set_device(index):
    touch(index)
    LIB.simnpu_set_device(index)


def _after_fork_in_child():
    global in_bad_fork, _cards_held
    if initialized:
        in_bad_fork = True
    _cards_held = set()


os.register_at_fork(after_in_child=_after_fork_in_child)


# ---- the registry npu-smi reads -------------------------------------------------------------
def state_dir():
    return os.environ.get("SIMNPU_STATE_DIR") or f"/tmp/simnpu-{os.getuid()}"


_registered = []


def _register(card):
    folder = os.path.join(state_dir(), "procs")
    try:
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{os.getpid()}-{card}")
        name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
        try:
            with open(f"/proc/{os.getpid()}/comm") as f:
                name = f.read().strip() or name
        except OSError:
            pass
        with open(path, "w") as f:
            f.write(f"{os.getpid()}\n{name}\n{card}\n")
        _registered.append(path)
    except OSError:
        pass   # npu-smi is a convenience; never fail a run for it


def _unregister():
    for path in _registered:
        try:
            if os.path.basename(path).startswith(f"{os.getpid()}-"):
                os.unlink(path)
        except OSError:
            pass


atexit.register(_unregister)


# ---- memory accounting: bytes of the host storages behind live npu tensors ---------------------
allocated = {}
peak = {}
_live = {}   # storage key -> [nbytes, live wrappers, device index]


def track(storage_key, nbytes, index):
    rec = _live.get(storage_key)
    if rec is None:
        _live[storage_key] = [nbytes, 1, index]
        a = allocated.get(index, 0) + nbytes
        allocated[index] = a
        if a > peak.get(index, 0):
            peak[index] = a
    else:
        rec[1] += 1


def release(storage_key):
    rec = _live.get(storage_key)
    if rec is None:
        return
    rec[1] -= 1
    if rec[1] <= 0:
        del _live[storage_key]
        allocated[rec[2]] = allocated.get(rec[2], 0) - rec[0]
