"""How much memory a step takes: tensor bytes per device, process RAM, accelerator allocations.

Three measures, each answering a different question (notebook 03b uses all three):

- ``tensor_bytes(model)``: bytes of the parameters and buffers that are NOT on ``meta``,
  per device. Exact and repeatable: where the tensors really live.
- ``PeakRAM``: the process's RSS and *private* memory (RSS minus shared/file-backed pages),
  sampled in a background thread, as growth over the start of the block. safetensors
  reads a checkpoint through mmap: the pages it touched count in RSS but belong to the page
  cache, so "private" is what the step really keeps. Before measuring, ``release_freed_memory``
  runs the garbage collector and glibc's ``malloc_trim(0)`` so that memory freed earlier is
  given back to the OS instead of being silently reused (which would hide a new allocation).
- ``accelerator_allocated(kind, count)``: ``torch.<kind>.memory_allocated(i)`` per device.

Importing this module never imports torch; the functions that need it import it lazily.
"""

from __future__ import annotations

import ctypes
import gc
import itertools
import threading
from collections.abc import Iterable, Mapping

import psutil

MB = 1e6


def ram() -> tuple[int, int]:
    """(rss, private) of this process in bytes; private = rss minus shared/file-backed pages (Linux)."""
    info = psutil.Process().memory_info()  # this process now (a forked child is not its parent)
    return info.rss, info.rss - getattr(info, "shared", 0)


def release_freed_memory() -> bool:
    """Collect garbage and give free heap pages back to the OS; False where malloc_trim is missing (not glibc)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        return False
    return True


class PeakRAM:
    """``with PeakRAM() as m: ...`` -> growth of RSS and private memory during the block, in bytes.

    After the block: ``m.rss_peak``, ``m.private_peak`` (highest growth seen by the sampler,
    which samples every ``interval`` seconds and so can miss shorter spikes) and
    ``m.private_end`` (growth still held at the end).
    """

    def __init__(self, interval: float = 0.002):
        self.interval = interval
        self.start = self.peak = self.end = (0, 0)
        self.rss_peak = self.private_peak = self.private_end = 0

    def __enter__(self) -> PeakRAM:
        release_freed_memory()
        self.start = self.peak = ram()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._see(ram())
            self._stop.wait(self.interval)

    def _see(self, now: tuple[int, int]) -> None:
        self.peak = (max(self.peak[0], now[0]), max(self.peak[1], now[1]))

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.end = ram()
        self._see(self.end)
        self.rss_peak = self.peak[0] - self.start[0]
        self.private_peak = self.peak[1] - self.start[1]
        self.private_end = self.end[1] - self.start[1]

    def __repr__(self) -> str:
        return (
            f"PeakRAM(private_end={self.private_end / MB:.1f} MB, private_peak={self.private_peak / MB:.1f} MB, "
            f"rss_peak={self.rss_peak / MB:.1f} MB)"
        )


def _under(name: str, prefixes: Iterable[str]) -> bool:
    return any(p == "" or name == p or name.startswith(p + ".") for p in prefixes)


def tensor_bytes(model, outside: Iterable[str] | None = None) -> dict[str, int]:
    """Bytes of parameters and buffers not on ``meta``, per device (``{"cpu": n, "npu:0": m}``).

    With ``outside`` (module names, e.g. a device_map's keys), count only the tensors that
    belong to none of them: the buffers a device_map does not name stay where they were.
    """
    prefixes = list(outside) if outside is not None else None
    per_device: dict[str, int] = {}
    for name, t in itertools.chain(model.named_parameters(), model.named_buffers()):
        if t.device.type == "meta" or (prefixes is not None and _under(name, prefixes)):
            continue
        dev = str(t.device)
        per_device[dev] = per_device.get(dev, 0) + t.numel() * t.element_size()
    return per_device


def bytes_per_target(device_map: Mapping[str, object], sizes: Mapping[str, int]) -> dict[str, int]:
    """Bytes a device_map sends to each target, from ``compute_module_sizes``-style ``sizes``."""
    out: dict[str, int] = {}
    for name, target in device_map.items():
        out[str(target)] = out.get(str(target), 0) + sizes[name]
    return out


def accelerator_allocated(kind: str, count: int) -> dict[str, int]:
    """Bytes held by tensors on each of ``count`` devices of ``kind`` (npu/cuda); ``{}`` for the CPU."""
    if kind == "cpu" or count == 0:
        return {}
    import torch

    backend = getattr(torch, kind)
    return {f"{kind}:{i}": backend.memory_allocated(i) for i in range(count)}
