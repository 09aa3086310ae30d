"""The notebook's work folder, and whether a person or a runner is at the kernel.

``work_dir``: in JupyterLab ``<cwd>/work/<notebook stem>``, kept so that a learner can rerun the commands in a
terminal; unattended (papermill, ``nbtools run``, CI) a private temporary folder, removed at exit. ``cleanup``
removes only what this process created.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import tempfile
from pathlib import Path

from .errors import ParameterError
from .lang import SESSION_ENV, msg

_CREATED: set[Path] = set()  # work dirs this process created: the only ones it may remove
_PERSISTENT: set[Path] = set()  # interactive work folders: kept so a learner can rerun the commands in a terminal
UNATTENDED_ENV = "NBTOOLS_UNATTENDED"  # set by the runner on every kernel it starts (kernels.KERNEL_ENV)
WORK = "work"  # the folder beside the notebooks that holds their interactive work folders (`nbtools reset` removes it)


def unattended(environ=None) -> bool:
    """Is this kernel run by papermill / ``python -m nbtools run`` / CI rather than by a person?

    True when ``NBTOOLS_UNATTENDED=1``, ``CI=true``, or the kernel's parent process command line
    mentions papermill or ``nbtools run``.
    """
    environ = os.environ if environ is None else environ
    if (environ.get(UNATTENDED_ENV, "").strip().lower() in ("1", "true", "yes")
            or environ.get("CI", "").strip().lower() in ("1", "true")):
        return True
    try:
        import psutil

        parent = " ".join(psutil.Process(os.getppid()).cmdline())
    except Exception:  # psutil missing, or the parent is gone / not ours to read
        return False
    return "papermill" in parent or "nbtools run" in parent


def notebook_stem(environ=None) -> str:
    """The running notebook's name without folder and suffix (JupyterLab sets JPY_SESSION_NAME), else 'notebook'."""
    environ = os.environ if environ is None else environ
    stem = Path(environ.get(SESSION_ENV, "").strip()).stem
    return re.sub(r"[^\w.-]", "_", stem) or "notebook"


def work_dir(path: str | os.PathLike = "", keep: bool = False, prefix: str = "nbtools-", *, persistent: bool = False,
             base: str | os.PathLike | None = None) -> Path:
    """The notebook's work dir.

    - ``path`` given: that folder (created if needed; a folder that existed before is never removed);
    - else ``persistent`` (interactive use): ``<base or cwd>/work/<notebook stem>``, kept after the
      notebook so a learner can ``cd`` there and rerun the commands in a terminal;
    - else a fresh private ``mkdtemp`` (mode 0700).

    A directory nbtools creates and that is not persistent is removed when the kernel exits
    (and by ``cleanup``) unless ``keep``, so a failing run leaves nothing behind either.
    """
    if not path and persistent:
        _PERSISTENT.add(p := _writable(Path(base or os.getcwd()) / WORK / notebook_stem(), ""))
        return p
    existed = bool(path) and Path(path).expanduser().resolve().exists()
    p = _writable(path, str(path)) if path else Path(tempfile.mkdtemp(prefix=prefix)).resolve()
    if not existed:
        _CREATED.add(p)
        if not keep:
            atexit.register(shutil.rmtree, p, True)
    return p


def _writable(path: str | os.PathLike, shown: str) -> Path:
    p = Path(path).expanduser().resolve()
    try:
        p.mkdir(parents=True, exist_ok=True)
        probe = p / ".nbtools-write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise ParameterError(
            f"parameter work_dir={shown!r} cannot be written ({exc.strerror or exc} at {p}); "
            "accepted: a writable directory, or '' for the default work folder"
        ) from None
    return p


def cleanup(path: str | os.PathLike, keep: bool = False) -> str:
    """Remove the work dir unless ``keep``, persistent, or it existed before; returns what was done."""
    p = Path(path).resolve()
    if keep:
        return msg("workdir.kept", path=p)
    if p in _PERSISTENT:
        return msg("workdir.kept_interactive", path=p)
    if p not in _CREATED:
        return msg("workdir.left", path=p)
    shutil.rmtree(p, ignore_errors=True)
    _CREATED.discard(p)
    return msg("workdir.removed", path=p)
