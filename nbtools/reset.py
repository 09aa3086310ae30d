"""`python -m nbtools reset`: a workshop machine back to its start state between two groups.

It does three things, says each one, and touches nothing else:

1. stops the launches nbtools started that are still running (``ps --kill``: only processes that
   carry nbtools' launch mark, never a learner's other jobs or JupyterLab's kernels);
2. removes the work folders the notebooks made in JupyterLab (``notebooks/work/``, beside the
   notebooks; unattended runs already remove theirs);
3. puts back the Accelerate the requirement files ask for, where 00's exercise replaced it: an
   Accelerate installed from a source checkout or a git URL, or one outside ``requirements.txt``'s
   range, is reinstalled from the package index (or, offline, from ``--find-links WHEELHOUSE``).

``--dry-run`` says what it would do and does nothing.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

from .runner import default_notebooks_dir

REQUIREMENTS = Path(__file__).resolve().parent.parent / "requirements.txt"
WORK = "work"  # the folder the notebooks' interactive work folders live in (session._work_dir)


def accelerate_requirement(path: Path = REQUIREMENTS) -> Requirement:
    """The ``accelerate`` line of requirements.txt (e.g. ``accelerate>=1.0``)."""
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line and Requirement(line).name.lower() == "accelerate":
            return Requirement(line)
    raise ValueError(f"{path} has no accelerate line")


def accelerate_problem(requirement: Requirement) -> str | None:
    """Why the installed Accelerate is not the one the requirement files give a learner; None when it is."""
    try:
        dist = metadata.distribution("accelerate")
    except metadata.PackageNotFoundError:
        return "Accelerate is not installed"
    direct = json.loads(dist.read_text("direct_url.json") or "{}")
    if direct:  # installed from a folder, a git URL or a file: 00's source install
        return f"Accelerate {dist.version} was installed from {direct.get('url', 'a local source')}"
    if not requirement.specifier.contains(dist.version, prereleases=True):
        return f"Accelerate {dist.version} is outside requirements.txt's {requirement}"
    return None


def reset(notebooks: Path | None = None, *, dry_run: bool = False, find_links: str | None = None, out=print) -> list[str]:
    """Do (or, with ``dry_run``, list) the three steps; returns the lines it printed."""
    from .ps import find, render, stop

    said: list[str] = []

    def say(text: str) -> None:
        said.append(text)
        out(text)

    verb = "would" if dry_run else "did"
    launches = find()
    if launches:
        say(f"launches still running ({len(launches)}):\n{render(launches)}")
        if not dry_run:
            stop(launches)
        say(f"{verb} stop them (guardian first, then SIGKILL whatever still carries nbtools' mark)")
    else:
        say("no launch of nbtools is running")

    work = (notebooks or default_notebooks_dir()) / WORK
    if work.is_dir():
        folders = sorted(p.name for p in work.iterdir())
        if not dry_run:
            shutil.rmtree(work)
        say(f"{verb} remove {work} ({len(folders)} work folder(s): {', '.join(folders) or 'empty'})")
    else:
        say(f"no work folders ({work} does not exist)")

    requirement = accelerate_requirement()
    problem = accelerate_problem(requirement)
    if problem is None:
        say(f"Accelerate {metadata.version('accelerate')} is what requirements.txt asks for ({requirement}): left alone")
        return said
    cmd = [sys.executable, "-m", "pip", "install", "--force-reinstall", "--no-deps", str(requirement)]
    if find_links:
        cmd[4:4] = ["--no-index", "--find-links", find_links]
    say(f"{problem}: {verb} reinstall it: {' '.join(cmd[1:])}")
    if not dry_run:
        subprocess.run(cmd, check=True)
        say(f"Accelerate is now {metadata.version('accelerate')}")
    return said
