#!/usr/bin/env python3
"""Start one JupyterLab container per learner on an Ascend host, each with its own cards (docs/teaching.md, 开班).

    python tools/classroom.py --learners 4 --out start-classroom.sh     # an 8-card host: 4 learners x 2 cards
    bash start-classroom.sh                                             # then hand out the roster's URLs

It writes a shell script (nothing is started here) and prints the roster: learner, cards, port, URL with its
token. The script builds the learners' image once (tools/classroom.Dockerfile: the quick-start's CANN image with
requirements-npu.txt), then starts one container per learner: its cards as devices (/dev/davinciN, never a card of
another learner), the host's driver mounted read-only as Ascend's container guide does, a persistent work folder,
and a JupyterLab on its own port with its own token. The card count comes from
`npu-smi info` (or --cards). Standard library only: a bare host needs nothing installed to run it.
"""

from __future__ import annotations

import argparse
import importlib.util
import secrets
import shlex
import subprocess
import sys
from pathlib import Path

BASE = "swr.cn-south-1.myhuaweicloud.com/ascendhub/cann:9.1.0-910b-ubuntu22.04-py3.12"  # the quick-start's image
IMAGE = "accelerate-ascend-classroom"  # built from BASE by tools/classroom.Dockerfile
SHARED_DEVICES = ("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")
DRIVER_MOUNTS = ("/usr/local/dcmi", "/usr/local/bin/npu-smi", "/usr/local/Ascend/driver/lib64",
                 "/usr/local/Ascend/driver/version.info", "/etc/ascend_install.info")


def host_cards() -> int:
    """The NPUs `npu-smi info` lists on this host (read with the series' own parser, loaded without nbtools' deps)."""
    path = Path(__file__).resolve().parent.parent / "nbtools" / "npusmi.py"
    spec = importlib.util.spec_from_file_location("npusmi", path)
    npusmi = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(npusmi)
    try:
        text = subprocess.run(["npu-smi", "info"], capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise SystemExit(f"cannot run `npu-smi info` ({exc}): run this on the Ascend host, or give --cards N") from None
    return len({n["id"] for n in npusmi.parse_npu_smi(text)["npus"]})


def plan(learners: int, per: int, cards: int) -> list[list[int]]:
    """Each learner's cards: consecutive, disjoint; refuse (with the hosts needed) when they do not fit."""
    if learners < 1 or per < 1:
        raise SystemExit("--learners and --cards-per-learner must be at least 1")
    if learners * per > cards:
        hosts = -(-learners * per // cards) if cards else "?"
        raise SystemExit(f"{learners} learners x {per} cards = {learners * per} cards; this host has {cards}: "
                         f"use {hosts} hosts of {cards} cards (run this script on each, with fewer --learners)")
    return [list(range(i * per, (i + 1) * per)) for i in range(learners)]


def docker_run(name: str, cards: list[int], port: int, token: str, home: Path, image: str) -> str:
    argv = ["docker", "run", "-d", "--name", name, "--restart", "unless-stopped", "--shm-size", "16g"]
    argv += [f"--device=/dev/davinci{c}" for c in cards] + [f"--device={d}" for d in SHARED_DEVICES]
    argv += [a for m in DRIVER_MOUNTS for a in ("-v", f"{m}:{m}:ro")]
    argv += ["-v", f"{home / name}:/home/ma-user/work", "-p", f"{port}:8888", image,
             "jupyter", "lab", "--ip=0.0.0.0", "--port=8888", "--no-browser", "--allow-root",
             f"--IdentityProvider.token={token}", "--ServerApp.root_dir=/home/ma-user/work"]
    return shlex.join(argv)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--learners", type=int, required=True)
    p.add_argument("--cards-per-learner", type=int, default=2, help="2: the quick-start's two-card lessons")
    p.add_argument("--cards", type=int, help="NPUs on this host (default: counted from `npu-smi info`)")
    p.add_argument("--base", default=BASE, help="the CANN image the learners' image is built on")
    p.add_argument("--first-port", type=int, default=8801, help="learner k's JupyterLab listens on first-port + k - 1")
    p.add_argument("--home", type=Path, default=Path("/srv/classroom"), help="each learner's persistent work folder")
    p.add_argument("--host", default="<this host's address>", help="the address learners open, for the roster")
    p.add_argument("--out", type=Path, required=True, help="the shell script to write")
    args = p.parse_args(argv)
    assignment = plan(args.learners, args.cards_per_learner, host_cards() if args.cards is None else args.cards)
    repo = Path(__file__).resolve().parent.parent
    lines = ["#!/usr/bin/env bash", "set -euo pipefail",
             shlex.join(["docker", "build", "-t", IMAGE, "--build-arg", f"BASE={args.base}",
                         "-f", str(repo / "tools" / "classroom.Dockerfile"), str(repo)])]
    roster = []
    for k, cards in enumerate(assignment, 1):
        name, port, token = f"learner{k:02d}", args.first_port + k - 1, secrets.token_hex(16)
        lines += [f"mkdir -p {shlex.quote(str(args.home / name))}", docker_run(name, cards, port, token, args.home, IMAGE)]
        roster.append(f"{name}\tcards {','.join(map(str, cards))}\thttp://{args.host}:{port}/lab?token={token}")
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {args.out} ({len(assignment)} containers); roster:\n" + "\n".join(roster))
    return 0


if __name__ == "__main__":
    sys.exit(main())
