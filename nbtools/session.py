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

from . import decide, proctree, workdir
from .decide import DEFAULT_TIMEOUT_S, LaunchSpec, cards, cpu_stands_in, plan, resolve, validate
from .device import BACKENDS, DISTRIBUTED_TYPES, DeviceInfo
from .expected import parse_kv
from .guarded import MARKER_ENV, stop_background
from .lang import msg
from .workdir import cleanup, unattended

NEEDS_REAL_NPU = msg("session.needs_real_npu", "zh")  # the Chinese edition's words (only_on_npu uses the notebook's)

def current() -> Session | None:
    """The open session of this kernel, if ``setup`` was called (and not closed): decide.OPEN, which a launch reads."""
    return decide.OPEN


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
        return msg("list_sep").join(dict.fromkeys(self.devices))

    def assert_ran(self, output: str) -> None:
        """Fail, saying why, when the ranks in ``output`` report another route than this host's (the CPU stand-in
        where the cards are, another count or backend); each rank's ``rank i of N on DEVICE`` line is compared too."""
        kv = parse_kv(output)  # a CPU is one device: accelerate 1.15 says cpu:0 there, 1.16 cpu
        ranks = {i: d.split(":")[0] if d.startswith("cpu") else d for i, d in re.findall(r"rank (\d+) of \d+ on ([a-z]+(?::\d+)?)", output)}
        want = {"world": str(self.world), "distributed_type": self.distributed_type, "backend": str(self.backend),
                "device": self.kind}
        sep = msg("list_sep")
        assert ranks or want.keys() & kv.keys(), msg("session.no_rank_report", keys=sep.join(want))
        wrong = [msg("session.wrong_value", key=k, got=kv[k], want=v) for k, v in want.items() if k in kv and kv[k] != v]
        if ranks and ranks != {str(i): d for i, d in enumerate(self.devices)}:
            wrong.append(msg("session.wrong_devices", ranks=ranks, want=list(self.devices)))
        assert not wrong, msg("session.wrong_route", where=self.where, wrong=sep.join(wrong))


@dataclass
class Session:
    info: DeviceInfo
    plan: LaunchSpec  # the route a launch of num_processes takes here (decide.plan)
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
        return resolve(self.info, self.device_param)

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
        said = {"n": n, "count": count, "name": name, "backend": BACKENDS.get(kind), "dtype": DISTRIBUTED_TYPES.get(kind)}
        if ran != kind:
            where, skip = msg("session.expect_fewer", **said), msg("session.skip_fewer", **said)
        elif kind == "cpu":
            where = msg("session.no_accelerator") if self.info.kind == "cpu" else msg("session.cpu_asked", kind=self.info.kind.upper())
            where += msg("session.expect_gloo", n=n)
        else:
            where = msg("session.expect_cards", **said)
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
            return msg("session.simulated_skip", needs=msg("session.needs_real_npu"), what=what)
        return msg("session.only_on_npu", what=what)

    def time_limit(self, what: str):
        """``with S.time_limit("notebook_launcher"): notebook_launcher(...)``: a call that forks ranks inside
        the kernel ends within ``timeout_s``, or fails saying so with its processes stopped (proctree.py)."""
        return proctree.time_limit(self.timeout_s, what)

    def cards(self, n: int | None = None) -> str:
        """The first ``n`` (default num_processes) of the cards this kernel may use, as a learner writes them
        ("4,5" where ASCEND_RT_VISIBLE_DEVICES=4,5,6,7 is set: a shared host's other cards stay untouched);
        0, 1, ... where no card is visible. Asked for more than it may use, the numbers after its last card follow
        ("4,5,6" for 3 where 4,5 are visible: ascending, no card twice; the plan falls back to the CPU there)."""
        return ",".join(cards(self.info, self.num_processes if n is None else n))

    # The quick-start-style device list for num_processes ("0,1" for 2; the plan's own on NPU and CUDA): cards()
    visible = property(cards)

    def platform_lines(self) -> list[str]:
        """What the setup cell prints, in the learner's language (the device label and versions stay as the CLI has them)."""
        info = self.info
        which = "simulated" if info.kind == "npu" and info.simulated else info.kind
        lines = [msg(f"session.platform_{which}", label=info.label, needs=msg("session.needs_real_npu")),
                 msg("session.versions", versions=info.versions_line().split(": ", 1)[1])]
        lines += [msg("session.problem", what=p.what, fix=p.fix) for p in info.problems]
        lines.append(msg("session.plan", note=self.plan.note))
        lines.append(msg("session.work", work=self.work))
        return lines

    def close(self) -> None:
        """Back to the original cwd; remove the work folder if nbtools made it and it is not kept."""
        if self.closed:
            print(msg("session.closed_already", cwd=Path.cwd()))
            return
        self.closed = True
        if decide.OPEN is self:
            decide.OPEN = None
        for pid in stop_launches():
            print(msg("session.stopped_background", pid=pid))
        try:
            os.chdir(self.origin)
            back = msg("session.back", origin=self.origin)
        except OSError as exc:
            back = msg("session.not_back", error=exc)
        print(cleanup(self.work, self.keep_work_dir) + msg("sep") + back)

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


def setup(device: str = "auto", num_processes: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S, work_dir: str = "",
          keep_work_dir: bool = False, *, info: DeviceInfo | None = None, allow_broken: bool = False) -> Session:
    """Check the parameters, detect the device (child-process probe), make the work folder and cd there.

    ``work_dir`` given: that folder (never removed if it existed). Empty: in interactive use a persistent
    ``<cwd>/work/<notebook stem>``; unattended (papermill, ``nbtools run``, CI) a private temporary folder
    removed by ``close()`` and at kernel exit.

    A broken setup (torch_npu without CANN, ...) stops here with the fix, unless ``allow_broken``:
    the orientation notebook, which teaches that fix, runs anyway and prints the problem.
    """
    origin = Path.cwd()
    if decide.OPEN is not None:  # the setup cell run again: start from the same place
        origin = decide.OPEN.origin
        decide.OPEN.close()
    info = validate(device=device, num_processes=num_processes, timeout_s=timeout_s, info=info,
                    require_healthy=not allow_broken)
    route = plan(info, num_processes, device)  # None: the one default count (decide.DEFAULT_PROCESSES)
    # given: that folder; else a persistent one under origin in interactive use, a private temporary one unattended
    work = workdir.work_dir(work_dir, keep=keep_work_dir, persistent=not work_dir and not unattended(), base=origin)
    session = Session(info, route, device, route.num_processes, timeout_s, work, keep_work_dir, origin)
    os.chdir(work)
    decide.OPEN = session
    print("\n".join(session.platform_lines()))
    return session
