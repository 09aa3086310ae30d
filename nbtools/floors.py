"""The lowest versions the series runs on, stated once; the one sentence a too-old image gets; what no install replaces.

Read by tools/install.py (before anything is installed), ``python -m nbtools doctor``, every setup cell (a
blocking problem from ``device.from_probe``) and ``import nbtools`` itself (the Python floor). Each floor is what
CI runs at its lowest (README, Tested stacks; tests/test_install.py holds them to the README's commands):
Python 3.10 and torch 2.9.0 (the floor-py310 command), Accelerate 1.15.0 (requirements-learner.txt's floor),
and CANN as the quick-start ran it.

Standard library only and no syntax newer than Python 3.6: an image too old for the series still hears from it
which image to use.
"""

import contextlib
import re

PYTHON = "3.10"
TORCH = "2.9.0"
ACCELERATE = "1.15.0"
CANN = "9.1.0"
# The quick-start's image (Ascend's registry): Python 3.12, CANN 9.1.0; torch + torch_npu from requirements-npu.txt.
IMAGE = "swr.cn-south-1.myhuaweicloud.com/ascendhub/cann:9.1.0-910b-ubuntu22.04-py3.12"
USE_INSTEAD = (f"use the quick-start's image ({IMAGE}) with `python tools/install.py --npu`, or a ModelArts custom "
               "image built from tools/classroom.Dockerfile")
FLOORS = (("python", PYTHON), ("torch", TORCH), ("cann", CANN))


def release(version):
    """(2, 9, 0) of '2.9.0', '2.9.0+cpu', '2.1.0a0+git12ab' or '9.1.0.alpha001'; () when it has no number."""
    m = re.match(r"\s*v?(\d+(?:\.\d+)*)", version or "")
    return tuple(int(x) for x in m.group(1).split(".")) if m else ()


def below(found, minimum):
    """Is ``found`` an older release than ``minimum`` ('2.9' equals '2.9.0')? False when ``found`` is unknown."""
    a, b = release(found), release(minimum)
    return bool(a) and a + (0,) * len(b) < b + (0,) * len(a)  # both padded with zeros to one length


def shortfall(versions):
    """What in ``versions`` (python, torch, cann) is below its floor, as one clause, or ''."""
    return ", ".join(f"{name} {versions[name]} (the series needs {floor} or later)"
                     for name, floor in FLOORS if versions.get(name) and below(versions[name], floor))


def refusal(versions):
    """The one sentence for an environment below a floor (what is too old, and what to use instead), or ''."""
    what = shortfall(versions)
    return f"this environment is too old for the series: {what}; {USE_INSTEAD}" if what else ""


# What an install never replaces: an NPU image's torch_npu is built for one torch release (and torchvision /
# torchaudio for one torch too). tools/install.py and `nbtools reset` hold each at its installed version.
HELD = ("torch", "torch-npu", "torchvision", "torchaudio")


def held():
    """{distribution: installed version} of the HELD packages this Python has (from their metadata)."""
    from importlib import metadata

    versions = {}
    for name in HELD:
        for spelling in (name, name.replace("-", "_")):
            with contextlib.suppress(metadata.PackageNotFoundError):
                versions[name] = metadata.version(spelling)
                break
    return versions


def constraints(versions):
    """pip's constraints file: each held package at its exact version; with no torch, torch at its floor."""
    lines = [f"{name}=={version}" for name, version in sorted(versions.items())]
    return "\n".join(lines + ([] if "torch" in versions else ["torch>=" + TORCH])) + "\n"
