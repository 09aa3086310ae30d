#!/usr/bin/env python3
"""Install the series into this Python, keeping the image's torch and torch_npu exactly as they are.

    python tools/install.py                                  # requirements-learner.txt, then the series (-e .)
    python tools/install.py -r requirements-deepspeed.txt    # any further pip arguments follow as written
    python tools/install.py --dry-run                        # what pip would install; nothing is installed
    python tools/install.py --npu                            # on an Ascend image: torch_npu too (see below)

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
With --npu (examples-guards' setup_example.sh, on a CANN image): an image with neither torch nor torch_npu gets the
quick-start's pair (requirements-npu.txt); one with torch and no torch_npu gets the torch_npu of that torch release
(the quick-start's for its torch), or, where pip finds none, the one sentence below and nothing held changed.
Standard library only, and Python 3.6 syntax: it runs on any image, even one too old for the series.
"""

import importlib.util
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LEARNER = os.path.join(ROOT, "requirements-learner.txt")
NPU = os.path.join(ROOT, "requirements-npu.txt")  # the quick-start's torch and torch_npu


def _floors():
    """nbtools/floors.py, loaded by its path: nbtools' own requirements are not installed yet."""
    spec = importlib.util.spec_from_file_location("floors", os.path.join(ROOT, "nbtools", "floors.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pip_command(constraints_file, args):
    return [sys.executable, "-m", "pip", "install", "-c", constraints_file, "-r", LEARNER, "-e", ROOT] + list(args)


def npu_args(held, floors, npu_requirements=NPU):
    """--npu: the pip arguments that bring torch_npu where the held versions lack it (none where it is there)."""
    pins = {}
    with open(npu_requirements) as f:
        for line in f:
            name, _, version = line.strip().partition("==")
            pins[name] = version
    if held.get("torch-npu"):
        return []
    if not held.get("torch"):
        return ["-r", npu_requirements]
    base = ".".join(str(n) for n in floors.release(held["torch"])[:3])  # torch_npu X.Y.Z[.postN] is for torch X.Y.Z
    return ["torch_npu==" + (pins["torch_npu"] if base == pins["torch"] else base + ".*")]


def main(argv=None):
    args = sys.argv[1:] if argv is None else argv
    if args[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    npu = "--npu" in args
    args = [a for a in args if a != "--npu"]
    floors = _floors()
    python = ".".join(map(str, sys.version_info[:3]))
    too_old = floors.refusal({"python": python})  # before importlib.metadata, which Python 3.7 and older lack
    held = {} if too_old else floors.held()
    too_old = too_old or floors.refusal({"python": python, "torch": held.get("torch")})
    if too_old:
        print("tools/install.py: nothing installed: " + too_old, file=sys.stderr)
        return 1
    extra = npu_args(held, floors) if npu else []
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
        npu_pin = "" if extra[:1] in ([], ["-r"]) else f" and of {extra[-1]} (the torch_npu for the torch held here)"
        print(f"tools/install.py: pip found no releases of the lessons' libraries{npu_pin} that "
              "accept the held versions above, or could not reach its index (its own message is above); nothing held "
              "was changed. Where the image is the problem: " + floors.USE_INSTEAD, file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
