"""Big-model inference (notebooks 03 and 03b): the quick-start's split, adapted to this machine.

- ``program_config``: the ``LlamaConfig(...)`` keywords of a ``python -c`` program, so a check can
  derive what to expect from the config the program really used.
- ``llama_param_count``: parameters of ``LlamaForCausalLM`` from its config alone.
- ``quickstart_device_map``: the quick-start's "first half / second half" map on two places
  (``commands.split_targets`` says which two on this machine; ``%cmd`` adapts the dispatch program with it).
- ``weights_shown_on``: where Accelerate leaves a module's weights for a device_map entry.

Importing this module never imports torch.

How much memory a step takes: tensor bytes per device and process RAM (notebook 03b reads the accelerators' own
counts, ``torch.<kind>.memory_allocated(i)``, itself):

- ``tensor_bytes(model)``: bytes of the parameters and buffers that are NOT on ``meta``,
  per device. Exact and repeatable: where the tensors really live.
- ``PeakRAM``: the process's RSS and *private* memory (RSS minus shared/file-backed pages),
  sampled in a background thread, as growth over the start of the block. safetensors
  reads a checkpoint through mmap: the pages it touched count in RSS but belong to the page
  cache, so "private" is what the step really keeps. Before measuring, ``release_freed_memory``
  runs the garbage collector and glibc's ``malloc_trim(0)`` so that memory freed earlier is
  given back to the OS instead of being silently reused (which would hide a new allocation).

Importing this module never imports torch; the functions that need it import it lazily.
"""

from __future__ import annotations

import ast
import contextlib
import ctypes
import gc
import itertools
import re
import shlex
import threading
from collections import Counter
from collections.abc import Iterable, Mapping

import psutil

from .commands import split_targets as split_targets
from .errors import NbtoolsError
from .ranks import EDGE, RANK_COLORS


def _program(text: str) -> str:
    """The Python source of ``python -c "..."`` (or the text itself when it is plain Python)."""
    with contextlib.suppress(ValueError):  # not shell words: plain Python
        words = shlex.split(text)
        if "-c" in words[:-1]:
            return words[words.index("-c") + 1]
    return text


def program_config(text: str, name: str = "LlamaConfig") -> dict:
    """Keyword arguments of the first ``LlamaConfig(...)`` call in a program (literals only)."""
    for node in ast.walk(ast.parse(_program(text))):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == name:
            return {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}
    raise NbtoolsError(f"no {name}(...) call in the program")


# transformers' LlamaConfig defaults: what a config that leaves a field out means
LLAMA_DEFAULTS = {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                  "num_attention_heads": 32, "num_key_value_heads": None, "head_dim": None,
                  "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False}


def llama_param_count(config: Mapping[str, object]) -> int:
    """Parameters of ``LlamaForCausalLM`` for a ``LlamaConfig(**config)`` (a missing field: LLAMA_DEFAULTS)."""
    return sum(llama_module_params(config).values())


def llama_module_params(config: Mapping[str, object]) -> dict[str, int]:
    """Parameters of each module a device_map names (``model.embed_tokens``, ``model.layers.N``, ``model.norm``,
    ``lm_head``), from the config alone: embeddings V*H; each layer q,k,v,o projections + gate,up,down + two
    RMSNorms; the final norm H; lm_head V*H (0 of its own when tied to the embeddings).
    """
    c = {**LLAMA_DEFAULTS, **config}
    V, H, F, L = c["vocab_size"], c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    head_dim = c["head_dim"] or H // c["num_attention_heads"]
    q = c["num_attention_heads"] * head_dim
    kv = (c["num_key_value_heads"] or c["num_attention_heads"]) * head_dim
    attention = H * q + 2 * H * kv + q * H + (q + 2 * kv + H if c["attention_bias"] else 0)
    mlp = 3 * H * F + (2 * F + H if c["mlp_bias"] else 0)
    layers = {f"model.layers.{i}": attention + mlp + 2 * H for i in range(L)}
    return {"model.embed_tokens": V * H, **layers, "model.norm": H, "lm_head": 0 if c["tie_word_embeddings"] else V * H}


def quickstart_device_map(first: str, second: str, num_layers: int = 20) -> dict[str, str]:
    """The quick-start's map: embeddings + first half of the layers -> first; the rest -> second."""
    layers = {f"model.layers.{i}": first if i < num_layers // 2 else second for i in range(num_layers)}
    return {"model.embed_tokens": first, **layers, "model.norm": second, "lm_head": second}


def weights_shown_on(target: str, device_map: Mapping[str, object]) -> str:
    """The device a module's weights show after dispatch, for its device_map entry ``target``.

    Offloaded weights (to ``disk``, or to ``cpu`` when the main device is an accelerator) stay on
    ``meta`` as placeholders; the hooks load them onto the execution device during forward.
    """
    main_is_accelerator = any(str(d) not in ("cpu", "disk") for d in device_map.values())
    target = str(target)
    return "meta" if target == "disk" or (target == "cpu" and main_is_accelerator) else target


def program_device_map(text: str) -> dict:
    """The device_map a dispatch program builds: its ``device_map = ...`` / ``device_map.update(...)`` lines, run alone."""
    lines = [ln.strip() for ln in _program(text).splitlines() if re.match(r"\s*device_map(\s*=\s*\{|\.update\()", ln)]
    if not lines:
        raise NbtoolsError("no `device_map = ...` lines in the program")
    namespace: dict = {}
    exec("\n".join(lines), {"__builtins__": {"range": range}}, namespace)  # literals and range() only
    return namespace["device_map"]


DEVICE_COLORS = {"cpu": RANK_COLORS[1], "disk": "#d9d9d9", "meta": "#ffffff"}
ACCEL_COLORS = (RANK_COLORS[0], *RANK_COLORS[2:5])  # the ranks' palette, less the colour the CPU has here
SHORT = {"model.embed_tokens": "emb", "model.norm": "norm", "lm_head": "head", "model.rotary_emb": "rope"}


def _color(device: str) -> str:
    """A device's colour: cpu, disk, meta their own; an accelerator (``npu:1``, or Accelerate's bare ``1``) by index."""
    index = device.rsplit(":", 1)[-1]
    return DEVICE_COLORS.get(device) or ACCEL_COLORS[int(index) % len(ACCEL_COLORS) if index.isdigit() else 0]


def draw_device_map(device_map: Mapping[str, object], title: str = ""):
    """One row of cells, a module each (in model order), coloured by the device the map sends it to."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    names = list(device_map)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.42 * len(names)), 1.9))
    for j, name in enumerate(names):
        dev = str(device_map[name])
        ax.add_patch(Rectangle((j, 0), 0.92, 1, facecolor=_color(dev), edgecolor=EDGE))
        ax.text(j + 0.46, 0.5, SHORT.get(name, name.rsplit(".", 1)[-1]), ha="center", va="center", fontsize=7)
    ax.set(xlim=(-0.2, len(names) + 0.2), ylim=(-0.1, 1.1))
    ax.axis("off")
    devices = list(dict.fromkeys(str(d) for d in device_map.values()))
    ax.legend(handles=[Patch(facecolor=_color(d), edgecolor=EDGE, label=d) for d in devices],
              loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=len(devices), frameon=False, fontsize=8)
    ax.set_title(title or "device_map: module -> device", fontsize=10)
    fig.tight_layout()
    return fig


def draw_budgets(used: Mapping[str, int], budgets: Mapping[str, int], reserve: Mapping[str, int], title: str = ""):
    """Bars: bytes placed on each device; a line at each device's budget (and at budget - reserve where given)."""
    import matplotlib.pyplot as plt

    devices = list(dict.fromkeys([*map(str, budgets), *map(str, used)]))
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    for j, dev in enumerate(devices):
        mb = used.get(dev, 0) / 1e6
        ax.bar(j, mb, width=0.6, color=_color(dev), edgecolor=EDGE)
        ax.text(j, mb, f"{mb:.0f} MB", ha="center", va="bottom", fontsize=8)
        if dev in budgets:
            ax.hlines(budgets[dev] / 1e6, j - 0.4, j + 0.4, colors="#c00000", linewidth=2,
                      label="max_memory budget" if j == 0 else None)
        if dev in reserve and dev in budgets:
            ax.hlines((budgets[dev] - reserve[dev]) / 1e6, j - 0.4, j + 0.4, colors="#c00000", linestyles="dashed",
                      linewidth=1.2, label="budget - largest layer (kept free)" if dev == next(iter(reserve)) else None)
    ax.set_xticks(range(len(devices)), [f"device {d}" if d.isdigit() else d for d in devices])
    ax.set(ylabel="MB placed", ylim=(0, 1.3 * (max([*budgets.values(), *used.values(), 1]) / 1e6)))  # legend room
    ax.legend(fontsize=8, loc="upper center", ncol=2, frameon=False)
    ax.set_title(title or "infer_auto_device_map: bytes per device against max_memory", fontsize=10)
    fig.tight_layout()
    return fig


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
            self.peak = tuple(map(max, self.peak, ram()))  # (rss, private), each at its highest
            self._stop.wait(self.interval)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.end = ram()
        self.peak = tuple(map(max, self.peak, self.end))
        self.rss_peak = self.peak[0] - self.start[0]
        self.private_peak = self.peak[1] - self.start[1]
        self.private_end = self.end[1] - self.start[1]

    def __repr__(self) -> str:
        return (f"PeakRAM(private_end={self.private_end / MB:.1f} MB, private_peak={self.private_peak / MB:.1f} MB, "
                f"rss_peak={self.rss_peak / MB:.1f} MB)")


def tensor_bytes(model, outside: Iterable[str] | None = None) -> dict[str, int]:
    """Bytes of parameters and buffers not on ``meta``, per device (``{"cpu": n, "npu:0": m}``).

    With ``outside`` (module names, e.g. a device_map's keys), count only the tensors that
    belong to none of them: the buffers a device_map does not name stay where they were.
    """
    prefixes = list(outside or ())
    per_device = Counter()
    for name, t in itertools.chain(model.named_parameters(), model.named_buffers()):
        if t.device.type != "meta" and not any(p == "" or name == p or name.startswith(p + ".") for p in prefixes):
            per_device[str(t.device)] += t.numel() * t.element_size()
    return dict(per_device)


def bytes_per_target(device_map: Mapping[str, object], sizes: Mapping[str, int]) -> dict[str, int]:
    """Bytes a device_map sends to each target, from ``compute_module_sizes``-style ``sizes``."""
    out: dict[str, int] = {}
    for name, target in device_map.items():
        out[str(target)] = out.get(str(target), 0) + sizes[name]
    return out
