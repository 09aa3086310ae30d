#!/usr/bin/env python3
"""Start one JupyterLab container per learner on an Ascend host, each with its own cards (docs/teaching.md, 2b).

    python3 tools/classroom.py --learners 4 --out start-classroom.sh   # an 8-card host: 4 learners x 2 cards
    bash start-classroom.sh                                            # then hand out the roster's URLs
    bash stop-classroom.sh [--archive]                                 # after the group: remove the containers

It writes two shell scripts (nothing is started here) and prints the roster: learner, cards, port, URL with its
token, and the TCP ports the host's firewall must open. The start script builds the learners' image (the
repository installed on the quick-start's CANN image by tools/classroom.Dockerfile; docker caches the build, so a
re-run rebuilds nothing unless the repository changed), then starts one container per learner: its cards as
devices (/dev/davinciN, never a card of another learner), the host's driver mounted read-only as Ascend's
container guide does, a share of the host's CPUs and memory (--cpus, --memory), a persistent work folder, and a
JupyterLab on its own port with its own token. Running it again replaces each container (same name, same token;
the work folders stay). The stop script (named after the start script: start-X.sh -> stop-X.sh) removes exactly
these containers and keeps the work folders; with --archive it moves them aside so that the next group starts
with empty ones. For a new group, run this again: new tokens. The card count comes from `npu-smi info` (or
--cards). Standard library only: a bare host needs nothing installed to run it.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import re
import secrets
import shlex
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parent.parent
LEARNER_IMAGE = "accelerate-ascend-classroom"  # built from the quick-start's image by tools/classroom.Dockerfile
SHARED_DEVICES = ("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")
DRIVER_MOUNTS = ("/usr/local/dcmi", "/usr/local/bin/npu-smi", "/usr/local/Ascend/driver/lib64",
                 "/usr/local/Ascend/driver/version.info", "/etc/ascend_install.info")
RESERVE_CPUS = 2  # what the host keeps for itself (docker, sshd, the page cache) before sharing out the rest
RESERVE_MIB = 8 * 1024
MIN_CPUS = 1  # the least this script gives a learner (a lesson runs a kernel and two ranks); less: refused
MIN_MIB = 4 * 1024
WHEELHOUSE = "wheelhouse"  # in the repository (the build context); tools/classroom.Dockerfile sees it there
OFFLINE_PIP_ARGS = f"--no-index --find-links /opt/series/{WHEELHOUSE}"
UNITS = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}


def _load(name: str):
    """A module of nbtools by its file path: a bare host has none of nbtools' requirements installed."""
    spec = importlib.util.spec_from_file_location(name, REPO / "nbtools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BASE = _load("floors").IMAGE  # the quick-start's image (nbtools/floors.py holds the one copy)


class Learner(NamedTuple):
    name: str
    cards: list[int]
    port: int
    token: str


class Room(NamedTuple):
    """What every learner's container shares: the image, where the work folders live, each one's CPUs and memory."""
    image: str
    home: Path
    cpus: str
    memory_mib: int


def host_cards() -> int:
    """The NPUs `npu-smi info` lists on this host (read with the series' own parser, loaded without nbtools' deps)."""
    npusmi = _load("npusmi")
    try:
        text = subprocess.run(["npu-smi", "info"], capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise SystemExit(f"cannot run `npu-smi info` ({exc}): run this on the Ascend host, or give --cards N") from None
    return len({n["id"] for n in npusmi.parse_npu_smi(text)["npus"]})


def host_memory_mib() -> int:
    """MemTotal of /proc/meminfo, in MiB."""
    try:
        text = Path("/proc/meminfo").read_text(encoding="ascii")
    except OSError:
        text = ""
    m = re.search(r"^MemTotal:\s+(\d+)\s*kB", text, re.M)
    if not m:
        raise SystemExit("cannot read MemTotal from /proc/meminfo: give --host-memory (e.g. 512g)")
    return int(m.group(1)) // 1024


def size_mib(text: str) -> int:
    """'16g', '512m', '1.5t' (binary units, as docker's --memory reads them) in MiB."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt])(?:i?b)?\s*", text, re.I)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r}: give a size with its unit, e.g. 16g or 512m")
    return int(float(m.group(1)) * UNITS[m.group(2).lower()])


def plan(learners: int, per: int, cards: int) -> list[list[int]]:
    """Each learner's cards: consecutive, disjoint; refuse (with the hosts needed) when they do not fit."""
    if learners < 1 or per < 1:
        raise SystemExit("--learners and --cards-per-learner must be at least 1")
    if learners * per > cards:
        hosts = -(-learners * per // cards) if cards else "?"
        raise SystemExit(f"{learners} learners x {per} cards = {learners * per} cards; this host has {cards}: "
                         f"use {hosts} hosts of {cards} cards (run this script on each, with fewer --learners)")
    return [list(range(i * per, (i + 1) * per)) for i in range(learners)]


class Resource(NamedTuple):
    flag: str  # docker run's option, and this script's --FLAG-per-learner
    unit: str  # how the numbers are written ("m": MiB, as docker reads them)
    reserve: float  # what the host keeps for itself
    least: float  # the least a learner gets


CPUS = Resource("cpus", "", RESERVE_CPUS, MIN_CPUS)
MEMORY = Resource("memory", "m", RESERVE_MIB, MIN_MIB)


def _num(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".")


def share(resource: Resource, learners: int, per: float | None, host: float) -> float:
    """Each learner's share of one resource: ``per`` as given, or (host - reserve) / learners; refused when the
    learners' shares exceed what the host has beyond its reserve, or a share is below the least."""
    r, spare = resource, host - resource.reserve
    each = spare / learners if per is None else per
    if per is not None and per * learners > spare + 1e-9:
        raise SystemExit(f"{learners} learners x --{r.flag} {_num(per)}{r.unit} = {_num(per * learners)}{r.unit}; "
                         f"this host has {_num(host)}{r.unit} and keeps {_num(r.reserve)}{r.unit} for itself "
                         f"({_num(max(spare, 0))}{r.unit} to share): give --{r.flag}-per-learner "
                         f"{_num(max(spare, 0) / learners)}{r.unit} or less, or fewer --learners")
    if each < r.least:
        raise SystemExit(f"each learner would get --{r.flag} {_num(each)}{r.unit} (the host's {_num(host)}{r.unit} "
                         f"less {_num(r.reserve)}{r.unit} kept, over {learners} learners); this script gives a "
                         f"learner at least {_num(r.least)}{r.unit}: fewer --learners, or a larger host")
    return each


def limits(args: argparse.Namespace) -> tuple[str, int]:
    """--cpus and --memory (MiB) of each container."""
    host_cpus = args.host_cpus or os.cpu_count() or 1
    host_mib = args.host_memory or host_memory_mib()
    cpus = share(CPUS, args.learners, args.cpus_per_learner, host_cpus)
    mib = share(MEMORY, args.learners, args.memory_per_learner, host_mib)
    return _num(math.floor(cpus * 100) / 100), int(mib)


def docker_build(base: str, offline: bool) -> list[str]:
    argv = ["docker", "build", "-t", LEARNER_IMAGE, "--build-arg", f"BASE={base}"]
    argv += ["--build-arg", f"PIP_ARGS={OFFLINE_PIP_ARGS}"] if offline else []
    return argv + ["-f", str(REPO / "tools" / "classroom.Dockerfile"), str(REPO)]


def docker_run(learner: Learner, room: Room) -> str:
    argv = ["docker", "run", "-d", "--name", learner.name, "--restart", "unless-stopped", "--shm-size", "16g",
            "--cpus", room.cpus, "--memory", f"{room.memory_mib}m"]
    argv += [f"--device=/dev/davinci{c}" for c in learner.cards] + [f"--device={d}" for d in SHARED_DEVICES]
    argv += [a for m in DRIVER_MOUNTS for a in ("-v", f"{m}:{m}:ro")]
    argv += ["-v", f"{room.home / learner.name}:/home/ma-user/work", "-p", f"{learner.port}:8888", room.image,
             "jupyter", "lab", "--ip=0.0.0.0", "--port=8888", "--no-browser", "--allow-root",
             f"--IdentityProvider.token={learner.token}", "--ServerApp.root_dir=/home/ma-user/work"]
    return shlex.join(argv)


def ports(learners: list[Learner]) -> str:
    first, last = learners[0].port, learners[-1].port
    return f"TCP {first}-{last}" if last != first else f"TCP {first}"


def start_script(learners: list[Learner], room: Room, build: list[str], stop: Path) -> str:
    """Idempotent: a second run rebuilds from docker's cache and replaces each container by its name."""
    lines = ["#!/usr/bin/env bash",
             f"# Written by tools/classroom.py: {len(learners)} JupyterLab containers ({learners[0].name} .. "
             f"{learners[-1].name}), each --cpus {room.cpus} --memory {room.memory_mib}m.",
             f"# The host's firewall must let the learners reach {ports(learners)}.",
             "# Running it again replaces each container (same token; the work folders stay). "
             f"Remove them: bash {shlex.quote(str(stop))}",
             "set -euo pipefail",
             shlex.join(build)]
    for learner in learners:
        folder = shlex.quote(str(room.home / learner.name))
        lines += [f"mkdir -p {folder}", f"docker rm -f {learner.name} >/dev/null 2>&1 || true",
                  docker_run(learner, room)]
    return "\n".join(lines) + "\n"


def stop_script(learners: list[Learner], room: Room, start: Path, stop: Path) -> str:
    """Removes exactly these containers; the work folders stay, or with --archive move to <home>/archive/<time>/."""
    names = [learner.name for learner in learners]
    archive = shlex.quote(str(room.home / "archive")) + '/"$(date +%Y%m%d-%H%M%S)"'
    lines = ["#!/usr/bin/env bash",
             f"# Written by tools/classroom.py with {shlex.quote(str(start))}: removes {', '.join(names)}.",
             f"#   bash {shlex.quote(str(stop))}             the work folders stay (the same group can start again)",
             f"#   bash {shlex.quote(str(stop))} --archive   they move to {room.home / 'archive'}/<date-time>/: "
             "the next group starts with empty ones",
             "set -euo pipefail",
             'case "${1:-}" in',
             "  '') archive='' ;;",
             f"  --archive) archive={archive} ;;",
             '  *) echo "usage: bash $0 [--archive]" >&2; exit 2 ;;',
             "esac",
             shlex.join(["docker", "rm", "-f", *names]) + " || true  # a container already gone is fine",
             'if [ -n "$archive" ]; then',
             '  mkdir -p "$archive"']
    for name in names:
        folder = shlex.quote(str(room.home / name))
        lines.append(f'  if [ -e {folder} ]; then mv {folder} "$archive"/; fi')
    lines += ['  echo "work folders moved to $archive"', "else",
              f"  echo {shlex.quote(f'work folders kept in {room.home}')}", "fi"]
    return "\n".join(lines) + "\n"


def stop_path(start: Path) -> Path:
    name = start.name
    return start.with_name("stop" + name[len("start"):] if name.startswith("start") else "stop-" + name)


def check_paths(out: Path, offline: bool) -> None:
    """The scripts hold the learners' tokens: never inside the image (.dockerignore keeps out the repository's
    top-level *.sh only). The offline build needs wheels in the repository's wheelhouse/."""
    out = out.resolve()
    if REPO in out.parents and not (out.parent == REPO and out.suffix == ".sh"):
        raise SystemExit(f"--out {out}: it holds the learners' tokens and would be copied into their image; "
                         f"write it outside the repository, or as a .sh file at its top ({REPO})")
    if offline and not any((REPO / WHEELHOUSE).glob("*.whl")):
        raise SystemExit(f"--wheelhouse: no wheels in {REPO / WHEELHOUSE}: make the wheelhouse first "
                         "(docs/teaching.md, 2b)")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--learners", type=int, required=True)
    p.add_argument("--cards-per-learner", type=int, default=2, help="2: the quick-start's two-card lessons")
    p.add_argument("--cards", type=int, help="NPUs on this host (default: counted from `npu-smi info`)")
    p.add_argument("--cpus-per-learner", type=float,
                   help=f"each container's --cpus (default: the host's CPUs less {RESERVE_CPUS} kept for the host, "
                        f"over the learners; refused when they do not fit or are below {MIN_CPUS})")
    p.add_argument("--memory-per-learner", type=size_mib, metavar="SIZE",
                   help=f"each container's --memory, e.g. 64g (default: MemTotal less {RESERVE_MIB // 1024}g kept "
                        f"for the host, over the learners; refused when they do not fit or are below "
                        f"{MIN_MIB // 1024}g)")
    p.add_argument("--host-cpus", type=int, help="the host's CPUs (default: os.cpu_count())")
    p.add_argument("--host-memory", type=size_mib, metavar="SIZE", help="the host's memory (default: /proc/meminfo)")
    p.add_argument("--base", default=BASE, help="the CANN image the learners' image is built on")
    p.add_argument("--wheelhouse", action="store_true",
                   help=f"build offline: pip installs only from the repository's {WHEELHOUSE}/ ({OFFLINE_PIP_ARGS})")
    p.add_argument("--first-port", type=int, default=8801, help="learner k's JupyterLab listens on first-port + k - 1 "
                   "(the host's firewall must let these TCP ports through)")
    p.add_argument("--home", type=Path, default=Path("/srv/classroom"), help="each learner's persistent work folder")
    p.add_argument("--host", default="<this host's address>", help="the address learners open, for the roster")
    p.add_argument("--out", type=Path, required=True,
                   help="the start script to write; the stop script goes beside it (start-X.sh -> stop-X.sh)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    assignment = plan(args.learners, args.cards_per_learner, host_cards() if args.cards is None else args.cards)
    cpus, memory_mib = limits(args)
    check_paths(args.out, args.wheelhouse)
    room = Room(LEARNER_IMAGE, args.home, cpus, memory_mib)
    learners = [Learner(f"learner{k:02d}", cards, args.first_port + k - 1, secrets.token_hex(16))
                for k, cards in enumerate(assignment, 1)]
    stop = stop_path(args.out)
    args.out.write_text(start_script(learners, room, docker_build(args.base, args.wheelhouse), stop), encoding="utf-8")
    stop.write_text(stop_script(learners, room, args.out, stop), encoding="utf-8")
    roster = [f"{x.name}\tcards {','.join(map(str, x.cards))}\thttp://{args.host}:{x.port}/lab?token={x.token}"
              for x in learners]
    print(f"wrote {args.out} ({len(learners)} containers, each --cpus {cpus} --memory {memory_mib}m) and {stop}\n"
          f"open {ports(learners)} in this host's firewall\nroster:\n" + "\n".join(roster))
    return 0


if __name__ == "__main__":
    sys.exit(main())
