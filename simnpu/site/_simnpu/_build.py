"""Build (once per torch version / ABI / source) and load the C++ part of the simulated NPU.

The shared library is compiled with g++ against the INSTALLED torch's headers at the first
``import torch_npu`` of a process, into ``${SIMNPU_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/simnpu}/<key>/``.
A file lock makes concurrent ranks build it once; the build goes to a temporary name and is
renamed into place, so a reader never sees half a library.
"""
import ctypes
import fcntl
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import time

import torch

CSRC = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "csrc"))
LIBNAME = "libsimnpu.so"


class SimNpuBuildError(RuntimeError):
    pass


def _sources():
    if not os.path.isdir(CSRC):
        raise SimNpuBuildError(f"simulated NPU: C++ sources not found at {CSRC} (the simnpu/site folder "
                               "must stay next to simnpu/csrc)")
    return sorted(os.path.join(CSRC, f) for f in os.listdir(CSRC) if f.endswith((".cpp", ".h")))


def _flags(torch_dir):
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return ["-O1", "-shared", "-fPIC", "-std=c++20", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            "-I" + os.path.join(torch_dir, "include"),
            "-I" + os.path.join(torch_dir, "include", "torch", "csrc", "api", "include")]


def cache_key():
    torch_dir = os.path.dirname(torch.__file__)
    h = hashlib.sha256()
    for src in _sources():
        with open(src, "rb") as f:
            h.update(os.path.basename(src).encode() + b"\0" + f.read())
    h.update(" ".join(_flags(torch_dir)).encode())
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return f"torch-{torch.__version__}-abi{abi}-{h.hexdigest()[:16]}"


def cache_root():
    root = os.environ.get("SIMNPU_CACHE_DIR")
    if not root:
        root = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "simnpu")
    return root


def library_path():
    return os.path.join(cache_root(), cache_key(), LIBNAME)


def _older_than(version, floor):
    """'2.8.0+cpu' < (2, 9): the release's first two numbers."""
    parts = version.split("+")[0].split(".")[:2]
    try:
        return tuple(int(p) for p in parts) < floor
    except ValueError:
        return False


def build(verbose=False):
    """Return the path of the built library, building it first if needed (safe across processes)."""
    path = library_path()
    if os.path.exists(path):
        return path
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    if _older_than(torch.__version__, (2, 9)):
        raise SimNpuBuildError(
            f"simulated NPU: torch {torch.__version__} is older than 2.9, the oldest torch it is built for (the "
            "quick-start's torch_npu 2.9.0.post2 pairs with torch 2.9.0): pip install 'torch>=2.9'")
    with open(os.path.join(folder, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if os.path.exists(path):        # another process built it while we waited
                return path
            # CXX as a shell splits it (`ccache g++`, `g++ -fuse-ld=gold`)
            gxx = shlex.split(os.environ.get("CXX", "")) or ([shutil.which("g++")] if shutil.which("g++") else [])
            if not gxx:
                raise SimNpuBuildError(
                    "simulated NPU: no C++ compiler found. The stand-in torch_npu compiles a small "
                    "device guard against the installed torch at first import; install g++ "
                    "(e.g. `apt-get install g++`) or set CXX.")
            torch_dir = os.path.dirname(torch.__file__)
            if not os.path.exists(os.path.join(torch_dir, "include", "c10", "core", "Device.h")):
                raise SimNpuBuildError(
                    f"simulated NPU: torch's C++ headers are missing under {torch_dir}/include; "
                    "they ship with the torch wheel from PyPI - reinstall torch from a wheel.")
            tmp = f"{path}.tmp.{os.getpid()}"
            cmd = [*gxx, *_flags(torch_dir), *[s for s in _sources() if s.endswith(".cpp")], "-L" + os.path.join(torch_dir, "lib"),
                   "-lc10", "-ltorch_cpu", "-Wl,-rpath," + os.path.join(torch_dir, "lib"), "-o", tmp]
            t0 = time.time()
            try:
                r = subprocess.run(cmd, capture_output=True, text=True)
            except OSError as exc:
                raise SimNpuBuildError(f"simulated NPU: cannot run the C++ compiler {shlex.join(gxx)!r} "
                                       f"(CXX={os.environ.get('CXX', '')!r}): {exc}") from exc
            if r.returncode != 0:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise SimNpuBuildError(
                    "simulated NPU: building the C++ device guard failed. It needs g++ with C++20 "
                    "(e.g. `apt-get install g++`, or set CXX to such a compiler) and the torch headers "
                    f"of {torch_dir}.\ncommand: {' '.join(cmd)}\n{r.stderr[-4000:]}")
            os.replace(tmp, path)
            if verbose or os.environ.get("SIMNPU_VERBOSE"):
                print(f"simulated NPU: built {path} in {time.time() - t0:.1f}s", file=sys.stderr)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return path


_LIB = None


def load():
    """Build if needed and load the library with RTLD_GLOBAL (its static initialisers register
    the PrivateUse1 device guard and hooks with torch)."""
    global _LIB
    if _LIB is None:
        lib = ctypes.CDLL(build(), mode=ctypes.RTLD_GLOBAL)
        C = ctypes
        for name, res, args in [
            ("simnpu_status", C.c_int, []), ("simnpu_device_count", C.c_int, []),
            ("simnpu_physical_id", C.c_int, [C.c_int]), ("simnpu_current_device", C.c_int, []),
            ("simnpu_initialized", C.c_int, []), ("simnpu_in_bad_fork", C.c_int, []),
            ("simnpu_touch", C.c_int, [C.c_int, C.c_char_p, C.c_int]),
            ("simnpu_set_device", C.c_int, [C.c_int, C.c_char_p, C.c_int]),
            ("simnpu_configure", None, [C.c_char_p, C.c_longlong, C.c_int, C.c_int]),
            ("simnpu_segments", C.c_int, [C.c_int, C.POINTER(C.c_longlong), C.c_int, C.POINTER(C.c_int),
                                          C.POINTER(C.c_int)]),
            ("simnpu_memory", None, [C.c_int, C.POINTER(C.c_longlong)]),
            ("simnpu_reset_peak", None, [C.c_int]), ("simnpu_reset_accumulated", None, [C.c_int]),
            ("simnpu_empty_cache", None, [C.c_int]), ("simnpu_set_fraction", None, [C.c_int, C.c_double]),
            ("simnpu_get_fraction", C.c_double, [C.c_int]),
            ("simnpu_manual_seed", None, [C.c_int, C.c_ulonglong]), ("simnpu_seed", C.c_ulonglong, [C.c_int]),
            ("simnpu_initial_seed", C.c_ulonglong, [C.c_int]),
            ("simnpu_get_rng_state", C.c_longlong, [C.c_int, C.c_void_p, C.c_longlong]),
            ("simnpu_set_rng_state", C.c_int, [C.c_int, C.c_void_p, C.c_longlong]),
        ]:
            getattr(lib, name).restype = res
            getattr(lib, name).argtypes = args
        _LIB = lib
    return _LIB


if __name__ == "__main__":   # python -m _simnpu._build  -> prebuild and print the path
    print(build(verbose=True))
