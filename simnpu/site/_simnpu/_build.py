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
import re
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


# The torch releases the C++ part (built against torch's internal c10 headers) is built and tested for: 2.9 (the
# quick-start's torch_npu 2.9.0.post2 pairs with torch 2.9.0) to 2.14, the newest tested. SIMNPU_TORCH_VERSION (for
# tests) is read instead of torch.__version__.
SUPPORTED = ((2, 9), (2, 14))


def refusal(version=None):
    """The sentence refusing this torch (older or newer than SUPPORTED), or "" where the C++ part builds for it."""
    version = version or os.environ.get("SIMNPU_TORCH_VERSION") or torch.__version__
    try:
        release = tuple(int(p) for p in version.split("+")[0].split(".")[:2])
    except ValueError:
        return ""
    (lo, hi) = SUPPORTED
    said = f"simulated NPU: torch {version} is not supported; the stand-in supports torch {lo[0]}.{lo[1]} to {hi[0]}.{hi[1]} ("
    if release < lo:
        return said + "the quick-start's torch_npu 2.9.0.post2 pairs with torch 2.9.0): pip install 'torch>=2.9'"
    if release > hi:
        return said + (f"torch {hi[0]}.{hi[1]} is the newest it was tested with): pip install 'torch<{hi[0]}.{hi[1] + 1}', "
                       "or run without --simulate-npu")
    return ""


def build(verbose=False):
    """Return the path of the built library, building it first if needed (safe across processes)."""
    if refused := refusal():
        raise SimNpuBuildError(refused)
    path = library_path()
    if os.path.exists(path):
        return path
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
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


C = ctypes
# The C types the ABI's declarations use, as ctypes names them (a pointer to bytes is passed as an address).
CTYPES = {"void": None, "int": C.c_int, "double": C.c_double, "long long": C.c_longlong,
          "unsigned long long": C.c_ulonglong, "char*": C.c_char_p, "unsigned char*": C.c_void_p,
          "int*": C.POINTER(C.c_int), "long long*": C.POINTER(C.c_longlong)}


def abi(text=None, end=";"):
    """{function: (restype, argtypes)} of simnpu.h's ``extern "C"`` block, the C ABI's one declaration (``text`` and
    ``end`` "{": a .cpp file's definitions, read the same way to compare)."""
    if text is None:
        with open(os.path.join(CSRC, "simnpu.h")) as f:
            text = f.read()
    out = {}
    for res, name, args in re.findall(rf"^([a-z][\w ]*?)\s+(simnpu_\w+)\(([^)]*)\)\s*{end}", text, re.M):
        types = [re.sub(r"\bconst\b|\w+$", "", a).replace(" *", "*").strip() for a in args.split(",") if a.strip()]
        out[name] = (CTYPES[res], [CTYPES[t] for t in types])
    return out


_LIB = None


def load():
    """Build if needed and load the library with RTLD_GLOBAL (its static initialisers register
    the PrivateUse1 device guard and hooks with torch)."""
    global _LIB
    if _LIB is None:
        lib = ctypes.CDLL(build(), mode=ctypes.RTLD_GLOBAL)
        for name, (res, args) in abi().items():
            getattr(lib, name).restype = res
            getattr(lib, name).argtypes = args
        _LIB = lib
    return _LIB


if __name__ == "__main__":   # python -m _simnpu._build  -> prebuild and print the path
    print(build(verbose=True))
