"""Validate notebook parameters before any process starts, and make the work dir."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

from .device import KINDS, DeviceInfo, detect
from .errors import DeviceError, ParameterError

MIXED_PRECISIONS = ("no", "fp16", "bf16")


def validate(
    *,
    device: str = "auto",
    num_processes: int = 1,
    mixed_precision: str | None = None,
    timeout_s: float | None = None,
    info: DeviceInfo | None = None,
) -> DeviceInfo:
    """Raise ParameterError naming the parameter and the accepted values; return the device info."""
    if device not in ("auto", *KINDS):
        raise ParameterError(f"parameter device={device!r} is not known; accepted: 'auto', 'npu', 'cuda', 'cpu'")
    if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
        raise ParameterError(f"parameter num_processes={num_processes!r} is invalid; accepted: an integer >= 1 (default 2)")
    if timeout_s is not None and (not isinstance(timeout_s, (int, float)) or timeout_s <= 0):
        raise ParameterError(f"parameter timeout_s={timeout_s!r} is invalid; accepted: a number of seconds > 0")
    info = info or detect()
    blocking = [p for p in info.problems if p.blocking]
    if blocking:
        raise DeviceError(
            "the setup is broken: " + "; ".join(f"{p.what}\n  fix: {p.fix}" for p in blocking)
            + "\n(`python -m nbtools doctor` checks the whole setup)"
        )
    try:
        kind = info.resolve(device)
    except DeviceError as exc:
        raise ParameterError(f"parameter {exc}") from None
    if mixed_precision is not None:
        if mixed_precision not in MIXED_PRECISIONS:
            raise ParameterError(
                f"parameter mixed_precision={mixed_precision!r} is not known; accepted: {', '.join(MIXED_PRECISIONS)}"
            )
        plan_kind = info.plan(num_processes, device).device
        ok = ("no", "bf16") if plan_kind == "cpu" else info.mixed_precisions
        if mixed_precision not in ok:
            raise ParameterError(
                f"parameter mixed_precision={mixed_precision!r} is not supported on {plan_kind} "
                f"({', '.join(info.names[:1]) or kind}); accepted here: {', '.join(ok)}"
            )
    return info


_CREATED: set[Path] = set()  # work dirs this process created: the only ones it may remove


def work_dir(path: str | os.PathLike = "", keep: bool = False, prefix: str = "nbtools-") -> Path:
    """The notebook's private work dir: ``path`` if given, else a fresh ``mkdtemp`` (mode 0700).

    A directory nbtools creates is removed when the kernel exits (and by ``cleanup``) unless
    ``keep``, so a failing run leaves nothing behind either. A directory that already existed
    is never removed: it may hold the learner's own files.
    """
    if path:
        p = Path(path).expanduser().resolve()
        existed = p.exists()
        try:
            p.mkdir(parents=True, exist_ok=True)
            probe = p / ".nbtools-write-test"
            probe.write_text("ok")
            probe.unlink()
        except OSError as exc:
            raise ParameterError(
                f"parameter work_dir={str(path)!r} cannot be written ({exc.strerror or exc}); "
                "accepted: a writable directory, or '' for a fresh private temporary directory"
            ) from None
    else:
        p = Path(tempfile.mkdtemp(prefix=prefix)).resolve()
        existed = False
    if not existed:
        _CREATED.add(p)
        if not keep:
            atexit.register(shutil.rmtree, p, True)
    return p


def cleanup(path: str | os.PathLike, keep: bool = False) -> str:
    """Remove the work dir unless ``keep`` or it existed before; returns what was done, for the cell to print."""
    p = Path(path).resolve()
    if keep:
        return f"work dir kept: {p}"
    if p not in _CREATED:
        return f"work dir left in place (it existed before this notebook, so it may hold your files): {p}"
    shutil.rmtree(p, ignore_errors=True)
    return f"work dir removed: {p}"
