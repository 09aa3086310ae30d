"""The notebook session: parameters checked, device detected, work folder made, cwd moved there.

``S = nbtools.setup(device=..., num_processes=..., timeout_s=..., work_dir=..., keep_work_dir=...)``
at the top of a notebook, ``S.close()`` in its last code cell. Between the two the kernel's working
directory is ``S.work``, so ``%%writefile train_npu.py`` and ``%launch ... accelerate launch ...
train_npu.py`` read exactly as in the quick-start. The magics (magics.py) use the current session's
device and timeout.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from . import proctree, workdir
from .device import BACKENDS, DISTRIBUTED_TYPES, DeviceInfo
from .expected import parse_kv
from .guarded import MARKER_ENV, stop_background
from .params import DEFAULT_TIMEOUT_S, validate
from .plan import LaunchPlan, cpu_stands_in
from .workdir import cleanup, unattended

NEEDS_REAL_NPU = "需要真实的 NPU"

_CURRENT: Session | None = None


def current() -> Session | None:
    """The open session of this kernel, if ``setup`` was called (and not closed)."""
    return _CURRENT if _CURRENT is not None and not _CURRENT.closed else None


@dataclass(frozen=True)
class Expected:
    """What the ranks of an N-process launch must report on this host (``Session.expect``): derived from the probe
    (the cards' kind and count) and the ``device`` parameter, never from the plan that chose the route."""

    world: int
    kind: str  # the device type the ranks report: npu / cuda / cpu
    distributed_type: str
    backend: str | None
    devices: tuple[str, ...]  # each rank's `accelerator.device`, in rank order
    where: str  # the host and what it implies, in a sentence
    skip: str = ""  # why a check that needs the cards cannot pass here (fewer cards than ranks); never a pass

    @property
    def on(self) -> str:
        """The ranks' devices as a learner reads them: "npu:0、npu:1"; "cpu" once."""
        return "、".join(dict.fromkeys(self.devices))

    def assert_ran(self, output: str) -> None:
        """Fail, saying why, when the ranks in ``output`` report another route than this host's (the CPU stand-in
        where the cards are, another count or backend); each rank's ``rank i of N on DEVICE`` line is compared too."""
        kv = parse_kv(output)  # a CPU is one device: accelerate 1.15 says cpu:0 there, 1.16 cpu
        ranks = {i: d.split(":")[0] if d.startswith("cpu") else d for i, d in re.findall(r"rank (\d+) of \d+ on ([a-z]+(?::\d+)?)", output)}
        want = {"world": str(self.world), "distributed_type": self.distributed_type, "backend": str(self.backend),
                "device": self.kind}
        assert ranks or want.keys() & kv.keys(), f"输出里没有 rank 报告的 {'、'.join(want)}：没有可以比较的内容"
        wrong = [f"{k}={kv[k]}（应为 {v}）" for k, v in want.items() if k in kv and kv[k] != v]
        if ranks and ranks != {str(i): d for i, d in enumerate(self.devices)}:
            wrong.append(f"各 rank 的设备 {ranks}（应为 {list(self.devices)}）")
        assert not wrong, (f"{self.where}，但 rank 报告 {'、'.join(wrong)}：这次启动没有走这台机器应走的路线"
                           "（例如卡就在这里，却由 CPU 代跑），所以不能算通过")


@dataclass
class Session:
    info: DeviceInfo
    plan: LaunchPlan
    device_param: str  # the `device` parameter as given ('auto', ...): what launches are planned for
    num_processes: int
    timeout_s: float
    work: Path
    keep_work_dir: bool = False
    origin: Path = field(default_factory=Path.cwd)  # the kernel's cwd before setup
    closed: bool = False

    @property
    def device(self) -> str:
        """The kind the single-device checks run on (npu / cuda / cpu): the device parameter, resolved here."""
        return self.info.resolve(self.device_param)

    def fitted(self, n: int | None = None) -> int:
        """The count a fitted launch (``%launch --fit``, the learner's own job) of ``n`` ranks uses here, from the
        probe and the device parameter: the visible cards when an accelerator has fewer, else ``n``."""
        n = self.num_processes if n is None else n
        return n if self.device == "cpu" else min(n, self.info.count)

    def expect(self, n: int | None = None) -> Expected:
        """What an ``n``-rank launch (default num_processes) must report here, from the probe and the device
        parameter alone (``plan()`` is not asked): on a host with ``n`` cards, the cards with hccl/nccl; with
        ``device='cpu'`` or no card, a gloo group on the CPU; with fewer cards, the labelled CPU stand-in, and
        ``skip`` says why a check that needs the cards is skipped there."""
        n = self.num_processes if n is None else n
        kind, count, name = self.device, self.info.count, self.device.upper()
        skip, ran = "", "cpu" if cpu_stands_in(kind, count, n) else kind
        if ran != kind:
            where = f"这台机器只看得见 {count} 张 {name}，要 {n} 个进程：按规则由 CPU 代跑（gloo）"
            skip = (f"需要 {n} 张 {name}，这台只看得见 {count} 张：{n} 个进程的启动由 CPU 代跑，"
                    f"证明不了 {BACKENDS[kind]}/{DISTRIBUTED_TYPES[kind]}（在有 {n} 张卡的机器上才算数）")
        elif kind == "cpu":
            where = "这里没有 NPU/CUDA" if self.info.kind == "cpu" else f"在 {self.info.kind.upper()} 机器上要了 device='cpu'"
            where += f"：{n} 个进程应当是 CPU 上的 gloo 进程组"
        else:
            where = f"这台机器看得见 {count} 张 {name}：{n} 个进程应当在卡上运行，用 {BACKENDS[kind]}/{DISTRIBUTED_TYPES[kind]}"
        devices = [ran] * n if ran == "cpu" or n == 1 else [f"{ran}:{i}" for i in range(n)]
        return Expected(n, ran, DISTRIBUTED_TYPES[ran] if n > 1 else "NO", BACKENDS[ran] if n > 1 else None,
                        tuple(devices), where, skip)

    def only_on_npu(self, what: str) -> str | None:
        """Why a check that only an Ascend card can answer does not run here, or None on a real NPU.

        ``if (why := S.only_on_npu("...")): nbtools.skipped(id, why)``: off NPU "只在 NPU 上检查：...";
        on the simulated NPU "需要真实的 NPU（这里的 NPU 是在 CPU 上模拟的）：...", never a pass.
        """
        if self.info.real_npu:
            return None
        if self.info.kind == "npu":
            return f"{NEEDS_REAL_NPU}（这里的 NPU 是在 CPU 上模拟的）：{what}"
        return f"只在 NPU 上检查：{what}"

    def time_limit(self, what: str):
        """``with S.time_limit("notebook_launcher"): notebook_launcher(...)``: a call that forks ranks inside
        the kernel ends within ``timeout_s``, or fails saying so with its processes stopped (proctree.py)."""
        return proctree.time_limit(self.timeout_s, what)

    def cards(self, n: int | None = None) -> str:
        """The first ``n`` (default num_processes) of the cards this kernel may use, as a learner writes them
        ("4,5" where ASCEND_RT_VISIBLE_DEVICES=4,5,6,7 is set: a shared host's other cards stay untouched);
        0, 1, ... where no card is visible. Asked for more than it may use, the numbers after its last card follow
        ("4,5,6" for 3 where 4,5 are visible: ascending, no card twice; the plan falls back to the CPU there)."""
        return ",".join(self.info.cards(self.num_processes if n is None else n))

    # The quick-start-style device list for num_processes ("0,1" for 2; the plan's own on NPU and CUDA): cards()
    visible = property(cards)

    def platform_lines(self) -> list[str]:
        """What the setup cell prints, in the learner's language (the device label and versions stay as the CLI has them)."""
        info = self.info
        if info.kind == "npu" and info.simulated:
            first = (f"平台：{info.label} —— 在 CPU 上模拟的 NPU：证明代码路径与连线（torch_npu、torch.npu、hccl、MULTI_NPU），"
                     f"不证明硬件；只有真卡才能回答的检查记为 skipped（{NEEDS_REAL_NPU}）")
        elif info.kind == "npu":
            first = f"平台：{info.label} —— 《快速开始》的平台：每项检查都真实运行"
        elif info.kind == "cuda":
            first = f"平台：{info.label} —— 此处不检查：torch_npu、CANN、hccl（由 nccl 代替 hccl）"
        else:
            first = "平台：CPU 代跑 —— 没有 NPU/CUDA；不检查：torch_npu、CANN、hccl、设备内存（由 gloo 代替 hccl）"
        lines = [first, "版本：" + info.versions_line().split(": ", 1)[1]]
        lines += [f"PROBLEM（问题）：{p.what} —— 修复：{p.fix}" for p in info.problems]
        lines.append(f"启动计划：{self.plan.note}")
        lines.append(f"工作文件夹：{self.work}（在终端里 cd 到这里，就能重跑这些命令）")
        return lines

    def close(self) -> None:
        """Back to the original cwd; remove the work folder if nbtools made it and it is not kept."""
        global _CURRENT
        if self.closed:
            print(f"会话已经关闭；当前目录 {Path.cwd()}")
            return
        self.closed = True
        if _CURRENT is self:
            _CURRENT = None
        for pid in stop_launches():
            print(f"停止了一个仍在运行的后台启动（它的守护进程 pid 为 {pid}）")
        try:
            os.chdir(self.origin)
            back = f"当前目录已回到 {self.origin}"
        except OSError as exc:
            back = f"当前目录没有恢复（{exc}）"
        print(f"{cleanup(self.work, self.keep_work_dir)}；{back}")

    def __repr__(self) -> str:
        return (f"Session(device={self.device!r}, num_processes={self.num_processes}, plan={self.plan.kind}/"
                f"{self.plan.backend}, work={str(self.work)!r}{', closed' if self.closed else ''})")


def stop_launches() -> list[int]:
    """Stop every launch this process started that still runs (``%launch --background``): through its
    ``Background`` (which also removes its private TMPDIR and reads its exit code), then any other found by the
    marker its guardian carries (``<launch id>:<this pid>``), stopped through that guardian. Their guardians' pids."""
    # found first: a Background whose guardian is wedged gets that guardian killed, and its tree re-parents to init
    procs = proctree.marked(MARKER_ENV, lambda mark: mark.endswith(f":{os.getpid()}"), within=os.getpid())
    stopped = stop_background()
    procs = [p for p in procs if proctree.is_alive(p)]
    guardians = proctree.tops(procs)  # the marker starts at the guardian: the kernel above it has none
    proctree.stop_from_top(procs, guardians)
    return stopped + [g.pid for g in guardians]


def setup(
    device: str = "auto",
    num_processes: int | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    work_dir: str = "",
    keep_work_dir: bool = False,
    *,
    info: DeviceInfo | None = None,
    allow_broken: bool = False,
) -> Session:
    """Check the parameters, detect the device (child-process probe), make the work folder and cd there.

    ``work_dir`` given: that folder (never removed if it existed). Empty: in interactive use a persistent
    ``<cwd>/work/<notebook stem>``; unattended (papermill, ``nbtools run``, CI) a private temporary folder
    removed by ``close()`` and at kernel exit.

    A broken setup (torch_npu without CANN, ...) stops here with the fix, unless ``allow_broken``:
    the orientation notebook, which teaches that fix, runs anyway and prints the problem.
    """
    global _CURRENT
    origin = Path.cwd()
    if _CURRENT is not None and not _CURRENT.closed:  # the setup cell run again: start from the same place
        origin = _CURRENT.origin
        _CURRENT.close()
    info = validate(
        device=device, num_processes=num_processes, timeout_s=timeout_s, info=info, require_healthy=not allow_broken
    )
    plan = info.plan(num_processes, device)  # None: the one default count (device.DEFAULT_PROCESSES)
    # given: that folder; else a persistent one under origin in interactive use, a private temporary one unattended
    work = workdir.work_dir(work_dir, keep=keep_work_dir, persistent=not work_dir and not unattended(), base=origin)
    session = Session(info, plan, device, plan.num_processes, timeout_s, work, keep_work_dir, origin)
    os.chdir(work)
    _CURRENT = session
    print("\n".join(session.platform_lines()))
    return session
