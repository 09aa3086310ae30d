"""Memory and load-speed figures for the seed's Llama, each taken in a FRESH Python process.

    python bench/memory.py [--checkpoint DIR] [--work DIR]   # all measurements, printed + JSON on stdout

Modes (one child process each, ``python bench/memory.py --mode MODE ...``; each prints one
``BENCH_JSON {...}`` line):

- ``skeleton`` / ``normal-init``: ``LlamaForCausalLM(config)`` under ``init_empty_weights``
  vs a plain init. Measured: tracemalloc (Python-heap allocations: module objects, dicts,
  Parameter wrappers; torch's tensor storage does NOT go through it), the bytes of tensor
  storage NOT on ``meta`` (parameters + buffers, deduplicated), and the RSS change. Imports
  and the lazy first instantiation (warmed with a 1-layer model) are excluded.
- ``dispatch``: ``load_checkpoint_and_dispatch`` with notebook 03's device map for this
  machine (``--map notebook``) or everything on ``cpu`` (``--map cpu``). Measured: wall time
  of that one call, peak RSS during it (psutil sampled every 2 ms in a thread) and ru_maxrss,
  both minus the RSS just before the call (imports and the skeleton already there); the
  file-backed part (safetensors maps the file: touched pages count in RSS but are page cache,
  shared and reclaimable) is reported apart from the anonymous part.
- ``load-file``: ``safetensors.torch.load_file`` of the same file; ``read-raw``: a plain
  ``readinto`` loop over it (8 MiB buffer). Both are the reference throughputs.
- ``build``: the seed's checkpoint (random weights, safetensors) into ``--checkpoint``.

The parent reads the file once before the timed modes, so every throughput is from the page
cache (hot), never from the disk; imports are outside every timed region. safetensors maps
the file: ``load_file`` and a CPU ``load_checkpoint_and_dispatch`` return tensors whose pages
are read only when used, so each is also timed "+ touch" (one element read per 4 KiB page of
every tensor in RAM), the only figure comparable with the plain read.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

LLAMA = dict(
    vocab_size=32000,
    hidden_size=512,
    intermediate_size=1024,
    num_hidden_layers=20,
    num_attention_heads=8,
    max_position_embeddings=64,
)
MB = 1e6


def _emit(d: dict) -> None:
    print("BENCH_JSON " + json.dumps(d), flush=True)


def _rss() -> tuple[int, int]:
    """(rss, file-backed + shmem resident) in bytes, from /proc/self/statm via psutil."""
    import psutil

    mi = psutil.Process().memory_info()
    return mi.rss, getattr(mi, "shared", 0)


def _maxrss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


class RssSampler:
    """Peak RSS (and the anonymous part) while the ``with`` block runs, sampled in a thread."""

    def __init__(self, interval: float = 0.002):
        self.interval = interval
        self.peak = self.peak_anon = 0
        self.samples = 0
        self._stop = threading.Event()

    def _run(self) -> None:
        import psutil

        proc = psutil.Process()
        while not self._stop.is_set():
            mi = proc.memory_info()
            self.peak = max(self.peak, mi.rss)
            self.peak_anon = max(self.peak_anon, mi.rss - getattr(mi, "shared", 0))
            self.samples += 1
            time.sleep(self.interval)

    def __enter__(self):
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        rss, shared = _rss()  # the final state counts too
        self.peak = max(self.peak, rss)
        self.peak_anon = max(self.peak_anon, rss - shared)


def _config():
    from transformers import LlamaConfig

    return LlamaConfig(**LLAMA)


def _storage_bytes(model) -> tuple[int, int]:
    """(bytes of tensor storage not on meta, number of such tensors), shared storages counted once."""
    seen, total, n = set(), 0, 0
    for t in [*model.parameters(), *model.buffers()]:
        if t.device.type == "meta":
            continue
        st = t.untyped_storage()
        key = (t.device.type, st.data_ptr())
        n += 1
        if key not in seen:
            seen.add(key)
            total += st.nbytes()
    return total, n


def _warm_imports():
    import torch  # noqa: F401
    import transformers.models.llama.modeling_llama  # noqa: F401  (lazy module: load it now)
    from accelerate import init_empty_weights
    from transformers import LlamaConfig, LlamaForCausalLM

    tiny = LlamaConfig(vocab_size=32, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=1, max_position_embeddings=64)
    with init_empty_weights():
        LlamaForCausalLM(tiny)  # first instantiation pulls lazy pieces (generation config, ...)
    LlamaForCausalLM(tiny)
    return init_empty_weights, LlamaForCausalLM


def mode_init(empty: bool) -> dict:
    """Build the seed's Llama twice after a warm-up: once untraced (time, RSS), once under tracemalloc."""
    import gc
    import tracemalloc

    init_empty_weights, LlamaForCausalLM = _warm_imports()
    config = _config()

    def build():
        if empty:
            with init_empty_weights():
                return LlamaForCausalLM(config)
        return LlamaForCausalLM(config)

    gc.collect()
    rss0, _ = _rss()
    t0 = time.perf_counter()
    model = build()
    seconds = time.perf_counter() - t0
    rss1, _ = _rss()
    storage, n_real = _storage_bytes(model)
    n_params = sum(p.numel() for p in model.parameters())
    on_meta = sum(p.device.type == "meta" for p in model.parameters())
    n_tensors = len(list(model.parameters()))
    del model
    gc.collect()
    tracemalloc.start()
    model = build()
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "mode": "skeleton" if empty else "normal-init",
        "seconds": seconds,
        "params": n_params,
        "param_tensors_on_meta": on_meta,
        "param_tensors": n_tensors,
        "real_tensors": n_real,
        "storage_bytes": storage,
        "tracemalloc_current_bytes": current,
        "tracemalloc_peak_bytes": peak,
        "rss_delta_bytes": rss1 - rss0,
    }


def _touch(tensors) -> int:
    """Read one element per 4 KiB page of every real tensor: makes lazily mapped weights resident."""
    import torch

    n = 0
    with torch.no_grad():
        for t in tensors:
            if t.device.type == "meta" or t.numel() == 0:
                continue
            flat = t.detach().reshape(-1)
            flat[:: max(1, 4096 // t.element_size())].sum().item()
            n += t.numel() * t.element_size()
    return n


def _device_map(which: str):
    """Notebook 03's map for this machine, or everything on the CPU."""
    if which == "cpu":
        return {"": "cpu"}, "all on cpu"
    import torch

    kind, n = "cpu", 0
    if hasattr(torch, "npu") and torch.npu.is_available():
        kind, n = "npu", torch.npu.device_count()
    elif torch.cuda.is_available():
        kind, n = "cuda", torch.cuda.device_count()
    if n >= 2:
        first, second = f"{kind}:0", f"{kind}:1"
    elif n == 1:
        first, second = f"{kind}:0", "cpu"
    else:
        first, second = "cpu", "disk"
    L = LLAMA["num_hidden_layers"]
    dm = {"model.embed_tokens": first}
    dm.update({f"model.layers.{i}": first for i in range(L // 2)})
    dm.update({f"model.layers.{i}": second for i in range(L // 2, L)})
    dm.update({"model.norm": second, "lm_head": second})
    return dm, f"{first} + {second} (notebook 03's map here)"


def _ckpt_file(ckpt: Path) -> Path:
    files = sorted(ckpt.glob("*.safetensors"))
    if len(files) != 1:
        raise SystemExit(f"expected one .safetensors file in {ckpt}, found {len(files)}")
    return files[0]


def mode_dispatch(ckpt: Path, which: str, work: Path) -> dict:
    import gc

    try:
        import torch_npu  # noqa: F401
    except ImportError:
        pass
    from accelerate import init_empty_weights, load_checkpoint_and_dispatch

    _, LlamaForCausalLM = _warm_imports()
    config = _config()
    device_map, label = _device_map(which)
    offload = work / f"offload-{which}"
    with init_empty_weights():
        skeleton = LlamaForCausalLM(config)
    gc.collect()
    rss0, shared0 = _rss()
    maxrss0 = _maxrss()
    t0 = time.perf_counter()
    with RssSampler() as s:
        loaded = load_checkpoint_and_dispatch(
            skeleton,
            checkpoint=str(ckpt),
            device_map=device_map,
            no_split_module_classes=["LlamaDecoderLayer"],
            offload_folder=str(offload),
        )
    seconds = time.perf_counter() - t0
    maxrss1 = _maxrss()
    rss1, shared1 = _rss()
    with RssSampler() as st:
        touched = _touch([*loaded.parameters(), *loaded.buffers()])
    seconds_touch = time.perf_counter() - t0
    devices = sorted({str(p.device) for p in loaded.parameters()})
    offloaded = sum(f.stat().st_size for f in offload.rglob("*") if f.is_file()) if offload.exists() else 0
    size = _ckpt_file(ckpt).stat().st_size
    return {
        "mode": f"dispatch-{which}",
        "device_map": label,
        "seconds": seconds,
        "seconds_with_touch": seconds_touch,
        "checkpoint_bytes": size,
        "mb_per_s": size / MB / seconds,
        "mb_per_s_with_touch": size / MB / seconds_touch,
        "touched_bytes": touched,
        "peak_rss_growth_with_touch_bytes": max(s.peak, st.peak) - rss0,
        "rss_before_bytes": rss0,
        "peak_rss_growth_bytes": s.peak - rss0,
        "peak_anon_growth_bytes": s.peak_anon - (rss0 - shared0),
        "maxrss_growth_bytes": max(0, maxrss1 - rss0),
        "maxrss_before_call_bytes": maxrss0,
        "rss_after_growth_bytes": rss1 - rss0,
        "file_backed_after_growth_bytes": shared1 - shared0,
        "samples": s.samples,
        "param_devices": devices,
        "offload_folder_bytes": offloaded,
    }


def mode_load_file(ckpt: Path) -> dict:
    import torch  # noqa: F401
    from safetensors.torch import load_file

    path = _ckpt_file(ckpt)
    size = path.stat().st_size
    rss0, shared0 = _rss()
    t0 = time.perf_counter()
    with RssSampler() as s:
        sd = load_file(str(path))
    seconds = time.perf_counter() - t0
    with RssSampler() as st:
        touched = _touch(sd.values())
    seconds_touch = time.perf_counter() - t0
    return {
        "mode": "load-file",
        "seconds": seconds,
        "seconds_with_touch": seconds_touch,
        "checkpoint_bytes": size,
        "touched_bytes": touched,
        "mb_per_s": size / MB / seconds,
        "mb_per_s_with_touch": size / MB / seconds_touch,
        "peak_rss_growth_with_touch_bytes": max(s.peak, st.peak) - rss0,
        "peak_rss_growth_bytes": s.peak - rss0,
        "peak_anon_growth_bytes": s.peak_anon - (rss0 - shared0),
    }


def mode_read_raw(ckpt: Path) -> dict:
    path = _ckpt_file(ckpt)
    size = path.stat().st_size
    buf = bytearray(8 << 20)
    view = memoryview(buf)
    total = 0
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(view)
            if not n:
                break
            total += n
    seconds = time.perf_counter() - t0
    assert total == size, (total, size)
    return {"mode": "read-raw", "seconds": seconds, "checkpoint_bytes": size, "mb_per_s": size / MB / seconds}


def mode_build(ckpt: Path) -> dict:
    """The seed's `dispatch_ckpt` setup block (random weights, safetensors)."""
    import torch
    from accelerate import init_empty_weights
    from transformers import LlamaForCausalLM

    t0 = time.perf_counter()
    with init_empty_weights():
        model = LlamaForCausalLM(_config())
    model.to_empty(device="cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.data = torch.randn(p.shape, device="cpu", dtype=p.dtype) * 0.02
    ckpt.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(ckpt), safe_serialization=True)
    return {"mode": "build", "seconds": time.perf_counter() - t0, "checkpoint_bytes": _ckpt_file(ckpt).stat().st_size}


# ---------------------------------------------------------------- driver (parent process)

def run_mode(mode: str, *args: str, timeout: float = 900) -> dict:
    """Run one mode in a fresh interpreter; returns its JSON plus the child's wall time."""
    argv = [sys.executable, str(Path(__file__).resolve()), "--mode", mode, *args]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    wall = time.perf_counter() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("BENCH_JSON ")]
    if proc.returncode != 0 or not lines:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        return {"mode": mode, "error": f"exit {proc.returncode}: {tail}", "process_wall_s": wall}
    d = json.loads(lines[-1][len("BENCH_JSON "):])
    d["process_wall_s"] = wall
    return d


def warm_page_cache(path: Path) -> float:
    """Read the file once in this process (no imports needed): every timed load then hits the page cache."""
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.read(8 << 20):
            pass
    return time.perf_counter() - t0


def measure_all(ckpt: Path | None, work: Path, log=print) -> dict:
    """Every measurement, each in its own process; builds the checkpoint when none is given."""
    work.mkdir(parents=True, exist_ok=True)
    res: dict = {}
    if ckpt is None or not list(Path(ckpt).glob("*.safetensors")):
        ckpt = work / "fake-llama-dispatch"
        log(f"  building the seed's checkpoint in {ckpt} ...")
        res["build"] = run_mode("build", "--checkpoint", str(ckpt))
    ckpt = Path(ckpt)
    res["checkpoint"] = str(ckpt)
    res["checkpoint_bytes"] = _ckpt_file(ckpt).stat().st_size
    steps = [
        ("skeleton", ["skeleton"]),
        ("normal_init", ["normal-init"]),
        ("read_raw", ["read-raw", "--checkpoint", str(ckpt)]),
        ("load_file", ["load-file", "--checkpoint", str(ckpt)]),
        ("dispatch_notebook", ["dispatch", "--checkpoint", str(ckpt), "--map", "notebook", "--work", str(work)]),
        ("dispatch_cpu", ["dispatch", "--checkpoint", str(ckpt), "--map", "cpu", "--work", str(work)]),
    ]
    for key, argv in steps:
        if argv[0] != "skeleton" and argv[0] != "normal-init":
            res.setdefault("warmup_read_s", warm_page_cache(_ckpt_file(ckpt)))
        log(f"  {key} (fresh process) ...")
        res[key] = run_mode(*argv)
        if "error" in res[key]:
            log(f"    ERROR: {res[key]['error']}")
    return res


def render(res: dict) -> list[str]:
    """Human-readable lines for a measure_all() result."""
    size = res["checkpoint_bytes"]
    out = [f"checkpoint: {res['checkpoint']} ({size / MB:.1f} MB safetensors, float32)"]
    sk, ni = res.get("skeleton", {}), res.get("normal_init", {})
    if sk and ni and "error" not in sk and "error" not in ni:
        out += [
            "model construction (imports and a 1-layer warm-up excluded):",
            f"  {'':34}{'init_empty_weights':>20}{'normal init':>16}",
            f"  {'tensor storage not on meta':34}{sk['storage_bytes'] / 1e3:>17.1f} kB{ni['storage_bytes'] / MB:>13.1f} MB",
            f"  {'python heap (tracemalloc peak)':34}{sk['tracemalloc_peak_bytes'] / 1e3:>17.1f} kB"
            f"{ni['tracemalloc_peak_bytes'] / 1e3:>13.1f} kB",
            f"  {'RSS change (untraced build)':34}{sk['rss_delta_bytes'] / MB:>17.2f} MB{ni['rss_delta_bytes'] / MB:>13.1f} MB",
            f"  {'time (untraced build)':34}{sk['seconds']:>18.3f} s{ni['seconds']:>14.2f} s",
            f"  {'param tensors on meta':34}{sk['param_tensors_on_meta']:>14}/{sk['param_tensors']:<5}"
            f"{ni['param_tensors_on_meta']:>10}/{ni['param_tensors']}",
        ]
    out += [
        "loading the checkpoint (page cache hot; imports and skeleton excluded; 'touch' = read every page"
        " of every tensor in RAM):",
        f"  {'':52}{'call':>8}{'+touch':>8}{'MB/s':>7}  peak RSS growth: call / +touch (anonymous part)",
    ]
    for key, what in (
        ("read_raw", "plain file read (readinto, 8 MiB buffer)"),
        ("load_file", "safetensors.torch.load_file"),
        ("dispatch_notebook", "load_checkpoint_and_dispatch"),
        ("dispatch_cpu", "load_checkpoint_and_dispatch"),
    ):
        d = res.get(key, {})
        if not d:
            continue
        if "error" in d:
            out.append(f"  {what:52} ERROR {d['error'].splitlines()[-1]}")
            continue
        label = what + (f" [{d['device_map']}]" if "device_map" in d else "")
        total = d.get("seconds_with_touch", d["seconds"])
        touch = f"{total:7.2f}s" if "seconds_with_touch" in d else f"{'-':>8}"
        mem = ""
        if "peak_rss_growth_bytes" in d:
            mem = (
                f"  +{d['peak_rss_growth_bytes'] / MB:.0f} MB ({d['peak_rss_growth_bytes'] / size:.2f}x)"
                f" / +{d['peak_rss_growth_with_touch_bytes'] / MB:.0f} MB"
                f" ({d['peak_rss_growth_with_touch_bytes'] / size:.2f}x) (anon +{d['peak_anon_growth_bytes'] / MB:.0f} MB)"
            )
        out.append(f"  {label:52}{d['seconds']:7.2f}s{touch}{size / MB / total:7.0f}{mem}")
        if "maxrss_growth_bytes" in d:
            out.append(
                f"  {'':52}ru_maxrss growth +{d['maxrss_growth_bytes'] / MB:.0f} MB; offload folder "
                f"{d['offload_folder_bytes'] / MB:.0f} MB; params on {', '.join(d['param_devices'])}"
            )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["skeleton", "normal-init", "dispatch", "load-file", "read-raw", "build"])
    p.add_argument("--checkpoint", type=Path)
    p.add_argument("--map", choices=["notebook", "cpu"], default="notebook")
    p.add_argument("--work", type=Path)
    a = p.parse_args(argv)
    if a.mode is None:
        work = a.work or Path(tempfile.mkdtemp(prefix="bench-memory-"))
        res = measure_all(a.checkpoint, work)
        print("\n".join(render(res)))
        print(json.dumps(res, indent=2))
        return 0
    if a.mode in ("skeleton", "normal-init"):
        _emit(mode_init(a.mode == "skeleton"))
    elif a.mode == "dispatch":
        _emit(mode_dispatch(a.checkpoint, a.map, a.work or Path(tempfile.mkdtemp(prefix="bench-offload-"))))
    elif a.mode == "load-file":
        _emit(mode_load_file(a.checkpoint))
    elif a.mode == "read-raw":
        _emit(mode_read_raw(a.checkpoint))
    elif a.mode == "build":
        _emit(mode_build(a.checkpoint))
    return 0


if __name__ == "__main__":
    sys.exit(main())
