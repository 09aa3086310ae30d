#!/usr/bin/env python3
"""Install the series into this Python, keeping the image's torch and torch_npu exactly as they are.

    python tools/install.py                                  # requirements-learner.txt, then the series (-e .)
    python tools/install.py -r requirements-deepspeed.txt    # any further pip arguments follow as written
    python tools/install.py --dry-run                        # what pip would install; nothing is installed
    python tools/install.py --npu                            # on an Ascend host: torch and torch_npu too (see below)

Run it with the Python that runs your kernel (README.zh-CN.md, section 2; a notebook prints it as
`sys.executable`). It
1. refuses a Python or torch older than the series supports, in one sentence that names the minimums and the
   image to use instead (nbtools/floors.py, the one statement of them), and installs nothing;
2. holds every installed torch, torch_npu, torchvision and torchaudio at its exact version in a constraints file,
   so that pip picks releases of the lessons' libraries that accept them (Accelerate 1.16 asks for torch >= 2.6:
   on an older torch pip takes 1.15), never a new torch;
3. runs `python -m pip install -c <constraints> -r requirements-learner.txt -e <this repository> [arguments]`;
4. checks that the held packages are the same versions afterwards.
Where no torch is installed (a laptop), pip installs the newest one the libraries accept, at least the floor.
With --npu (a bare-metal Ascend host; examples-guards' setup_example.sh on a CANN image): a Python with neither torch
nor torch_npu gets the quick-start's pair (requirements-npu.txt) and requirements.txt; one with torch and no torch_npu
gets the torch_npu of that torch release (the quick-start's for its torch), or, where pip finds none, the one sentence
below and nothing held changed. The pair's torch depends on the machine: on aarch64 PyPI's torch 2.9.0; on x86_64,
where torch_npu's wheel requires torch==2.9.0+cpu, that build from PyTorch's CPU index, installed first as Ascend's
install guide does (`--torch-index URL`: a mirror of that index), then held like an image's torch while torch_npu
comes from PyPI. A host that cannot reach that index hears one sentence with the command to install it by hand.
For tests only: NBTOOLS_INSTALL_MACHINE stands in for platform.machine() (x86_64, aarch64).
Standard library only, and Python 3.6 syntax: it runs on any image, even one too old for the series.
"""

import importlib.util
import os
import platform
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LEARNER = os.path.join(ROOT, "requirements-learner.txt")
NPU = os.path.join(ROOT, "requirements-npu.txt")  # the quick-start's torch (one per machine) and torch_npu
SERIES = os.path.join(ROOT, "requirements.txt")  # what requirements-npu.txt adds on a bare-metal host
TORCH_INDEX = "https://download.pytorch.org/whl/cpu"  # PyTorch's CPU index: the only home of torch X.Y.Z+cpu
MACHINE = os.environ.get("NBTOOLS_INSTALL_MACHINE") or platform.machine()  # the variable: for tests only


def _floors():
    """nbtools/floors.py, loaded by its path: nbtools' own requirements are not installed yet."""
    spec = importlib.util.spec_from_file_location("floors", os.path.join(ROOT, "nbtools", "floors.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pip_command(constraints_file, args):
    return [sys.executable, "-m", "pip", "install", "-c", constraints_file, "-r", LEARNER, "-e", ROOT] + list(args)


def npu_pins(machine=MACHINE, npu_requirements=NPU):
    """requirements-npu.txt's torch and torch_npu for this machine (a line's `; platform_machine == "..."` marker)."""
    pins = {}
    with open(npu_requirements) as f:
        for line in f:
            m = re.match(r'(torch|torch_npu)==([^\s;]+)\s*(?:;\s*platform_machine\s*==\s*"([^"]+)")?\s*$', line.strip())
            if m and m.group(3) in (None, machine):
                pins[m.group(1)] = m.group(2)
    return pins


def npu_plan(held, floors, machine=MACHINE, npu_requirements=NPU):
    """--npu: (the torch to install first from PyTorch's CPU index, or None; the pip arguments that bring torch_npu,
    and with no torch here the series too). Nothing where torch_npu is there."""
    pins = npu_pins(machine, npu_requirements)
    npu = "torch_npu==" + pins["torch_npu"]
    if held.get("torch-npu"):
        return None, []
    if not held.get("torch"):  # a +cpu torch (x86_64) is on PyTorch's CPU index only: installed before the rest
        torch = "torch==" + pins["torch"]
        return (torch, [npu, "-r", SERIES]) if "+" in torch else (None, [torch, npu, "-r", SERIES])
    base = ".".join(str(n) for n in floors.release(held["torch"])[:3])  # torch_npu X.Y.Z[.postN] is for torch X.Y.Z
    return None, [npu if floors.release(base) == floors.release(pins["torch"])[:3] else "torch_npu==" + base + ".*"]


def install_torch_first(torch, index, dry_run):
    """x86_64 with no torch: torch X.Y.Z+cpu from PyTorch's CPU index (or the mirror given), as Ascend's install guide
    installs it; 0, or 1 after the one sentence with the command to run by hand."""
    cmd = [sys.executable, "-m", "pip", "install", "--index-url", index, torch] + (["--dry-run"] if dry_run else [])
    print("$ " + " ".join(cmd), flush=True)
    if subprocess.call(cmd) == 0:
        return 0
    print(f"tools/install.py: nothing else installed: torch_npu's {MACHINE} wheel requires {torch}, a build that only "
          f"PyTorch's CPU index has, and pip could not install it from {index} (its message is above); on a host that "
          f"cannot reach that index, install it from a copy or mirror of it, `python -m pip install {torch} --index-url "
          f"{TORCH_INDEX}` (or `python tools/install.py --npu --torch-index <mirror>`), then run "
          "`python tools/install.py --npu` again.", file=sys.stderr)
    return 1


def main(argv=None):
    args = sys.argv[1:] if argv is None else argv
    if args[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    npu = "--npu" in args
    index = args[args.index("--torch-index") + 1] if "--torch-index" in args[:-1] else TORCH_INDEX
    args = [a for i, a in enumerate(args) if a != "--npu" and "--torch-index" not in args[max(i - 1, 0):i + 1]]
    floors = _floors()
    python = ".".join(map(str, sys.version_info[:3]))
    too_old = floors.refusal({"python": python})  # before importlib.metadata, which Python 3.7 and older lack
    held = {} if too_old else floors.held()
    too_old = too_old or floors.refusal({"python": python, "torch": held.get("torch")})
    if too_old:
        print("tools/install.py: nothing installed: " + too_old, file=sys.stderr)
        return 1
    if npu and not held.get("torch") and "torch" not in npu_pins():
        print(f"tools/install.py: nothing installed: requirements-npu.txt names the quick-start's torch for x86_64 and "
              f"aarch64 (torch_npu's Ascend hosts) only, and this machine is {MACHINE}.", file=sys.stderr)
        return 1
    first, extra = npu_plan(held, floors) if npu else (None, [])
    if first:
        rc = install_torch_first(first, index, "--dry-run" in args)
        if rc or "--dry-run" in args:  # pip plans torch_npu and the rest only once that torch is installed
            if not rc:
                print(f"then, once {first} is installed: {' '.join(extra)}, around that torch (not planned here)")
            return rc
        held = floors.held()  # the torch just installed is held like an image's
    args = extra + args
    print(f"installing into {sys.executable} (Python {python})" + (
        f"; torch_npu missing, so also: {' '.join(extra)}" if extra else ""))
    print("held at their installed versions: " + (", ".join("{} {}".format(*kv) for kv in sorted(held.items()))
                                                  or f"nothing (no torch here: pip installs torch >= {floors.TORCH})"))
    fd, path = tempfile.mkstemp(prefix="held-", suffix=".txt")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(floors.constraints(held))
        cmd = pip_command(path, args)
        print("$ " + " ".join(cmd), flush=True)
        rc = subprocess.call(cmd)
    finally:
        os.unlink(path)
    after = floors.held()
    changed = sorted(name for name in held if after.get(name) != held[name])
    if changed:  # pip honours constraints; this would be a pip bug or another process
        print("tools/install.py: CHANGED during the install: " + ", ".join(
            f"{n} {held[n]} -> {after.get(n)}" for n in changed), file=sys.stderr)
        return 1
    if rc:
        npu_pin = "".join(f" and of {a} (the torch_npu for the torch here)" for a in extra if "torch_npu" in a)
        print(f"tools/install.py: pip found no releases of the lessons' libraries{npu_pin} that "
              "accept the held versions above, or could not reach its index (its own message is above); nothing held "
              "was changed. Where the image is the problem: " + floors.USE_INSTEAD, file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
