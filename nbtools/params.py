"""Validate notebook parameters before any process starts, and make the work dir.

Checks for a notebook's own parameters (``nbtools.setup`` checks the common ones).

Each raises ``ParameterError`` naming the parameter, its value and what is accepted, before any
process starts: ``whole_numbers(1, epochs=epochs, hidden=hidden)``,
``numbers_between(0, 1, inclusive=False, test_size=test_size)``.
"""

from __future__ import annotations

import ast
import atexit
import math
import os
import re
import shutil
import tempfile
from pathlib import Path

# whole_numbers lives with the device rules it serves (num_processes); the notebooks import it from here
from .device import MIXED_PRECISIONS, DeviceInfo, detect, known_device, whole_numbers
from .errors import DeviceError, ParameterError


def validate(
    *,
    device: str = "auto",
    num_processes: int = 1,
    mixed_precision: str | None = None,
    timeout_s: float | None = None,
    info: DeviceInfo | None = None,
    require_healthy: bool = True,
) -> DeviceInfo:
    """Raise ParameterError naming the parameter and the accepted values; return the device info.

    A broken setup (e.g. torch_npu without CANN) raises DeviceError with the fix, unless
    ``require_healthy`` is False (a notebook that explains the fix must still run).
    """
    known_device(device)
    whole_numbers(1, num_processes=num_processes)
    if timeout_s is not None and (not isinstance(timeout_s, (int, float)) or timeout_s <= 0):
        raise ParameterError(f"parameter timeout_s={timeout_s!r} is invalid; accepted: a number of seconds > 0")
    info = info or detect()
    blocking = [p for p in info.problems if p.blocking]
    if blocking and require_healthy:
        raise DeviceError(
            "the setup is broken: " + "; ".join(f"{p.what}\n  fix: {p.fix}" for p in blocking)
            + "\n(`python -m nbtools doctor` checks the whole setup)"
        )
    kind = info.resolve(device)  # DeviceError (names device=..., what is here and what to use)
    if mixed_precision is not None:
        if mixed_precision not in MIXED_PRECISIONS:
            raise ParameterError(
                f"parameter mixed_precision={mixed_precision!r} is not known; accepted: {', '.join(MIXED_PRECISIONS)}"
            )
        plan_kind = info.plan(num_processes, device).kind
        ok = info.mixed_precisions_on(plan_kind)
        if mixed_precision not in ok:
            raise ParameterError(
                f"parameter mixed_precision={mixed_precision!r} is not supported on {plan_kind} "
                f"({', '.join(info.names[:1]) or kind}); accepted here: {', '.join(ok)}"
            )
    return info


_CREATED: set[Path] = set()  # work dirs this process created: the only ones it may remove
_PERSISTENT: set[Path] = set()  # interactive work folders: kept so a learner can rerun the commands in a terminal
UNATTENDED_ENV = "NBTOOLS_UNATTENDED"


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
    stem = Path(environ.get("JPY_SESSION_NAME", "").strip()).stem
    return re.sub(r"[^\w.-]", "_", stem) or "notebook"


def work_dir(
    path: str | os.PathLike = "",
    keep: bool = False,
    prefix: str = "nbtools-",
    *,
    persistent: bool = False,
    base: str | os.PathLike | None = None,
) -> Path:
    """The notebook's work dir.

    - ``path`` given: that folder (created if needed; a folder that existed before is never removed);
    - else ``persistent`` (interactive use): ``<base or cwd>/work/<notebook stem>``, kept after the
      notebook so a learner can ``cd`` there and rerun the commands in a terminal;
    - else a fresh private ``mkdtemp`` (mode 0700).

    A directory nbtools creates and that is not persistent is removed when the kernel exits
    (and by ``cleanup``) unless ``keep``, so a failing run leaves nothing behind either.
    """
    if not path and persistent:
        path = Path(base or os.getcwd()) / "work" / notebook_stem()
        p = _writable(path, "")
        _PERSISTENT.add(p)
        return p
    if path:
        existed = Path(path).expanduser().resolve().exists()
        p = _writable(path, str(path))
    else:
        p = Path(tempfile.mkdtemp(prefix=prefix)).resolve()
        existed = False
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
        return f"工作文件夹已保留：{p}"
    if p in _PERSISTENT:
        return f"工作文件夹已保留（交互使用：在终端里 cd 到这里，就能重跑这些命令）：{p}"
    if p not in _CREATED:
        return f"工作文件夹原样留下（它在本 notebook 之前就已存在，可能有你的文件）：{p}"
    shutil.rmtree(p, ignore_errors=True)
    _CREATED.discard(p)
    return f"工作文件夹已删除：{p}"


# --- notebook parameters: what a notebook declares, and `-p NAME=VALUE` converted by its defaults ---

NO_DEFAULT = object()  # a default that is not a literal (an expression): no type to convert by


def parameter_defaults(notebook: str | os.PathLike) -> dict:
    """Name -> default value of the notebook's `parameters` cell, as papermill's ``inspect_notebook``
    reads it without executing anything (``NO_DEFAULT`` where the default is no literal)."""
    import papermill

    out = {}
    for name, declared in papermill.inspect_notebook(str(notebook)).items():
        try:
            out[name] = ast.literal_eval(declared["default"])
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            out[name] = NO_DEFAULT
    return out


def _parse_value(text: str):
    """A value whose default gives no type (None, an expression, a list): YAML, as papermill's CLI does."""
    import yaml

    if not text.strip():
        return ""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def parse_params(items: list[str] | None) -> dict:
    """``-p NAME=VALUE`` items -> {NAME: "VALUE"}: the text as typed; each notebook converts it
    by the type of its own default (``convert_parameter``)."""
    params = {}
    for item in items or []:
        if "=" not in item:
            raise ParameterError(f"-p {item!r}: expected NAME=VALUE (e.g. -p num_processes=2)")
        name, value = item.split("=", 1)
        name = name.strip()
        if not name.isidentifier():
            raise ParameterError(f"-p {item!r}: {name!r} is not a parameter name (e.g. -p num_processes=2)")
        params[name] = value
    return params


TRUE_WORDS = ("true", "1", "yes")
FALSE_WORDS = ("false", "0", "no")


def convert_parameter(name: str, value, default, notebook: str = ""):
    """The value to inject for ``name``, converted by the type of the notebook's default.

    str default: the text as is (``accelerate_ref=1.10`` stays "1.10", ``work_dir=~`` is "~");
    bool: true/false/1/0/yes/no (any case); int; float. A default of another type (None, a
    list, an expression): YAML. A value that is not text (the Python API) passes unchanged.
    Raises ParameterError naming the parameter, its default's type and the value.
    """
    if not isinstance(value, str):
        return value
    where = f" in {notebook}" if notebook else ""

    def refuse(accepted: str):
        return ParameterError(
            f"-p {name}={value!r}: the default of {name}{where} is {default!r} ({type(default).__name__}), "
            f"and {value!r} is not {accepted}"
        )

    text = value.strip()
    if isinstance(default, bool):
        if text.lower() in TRUE_WORDS:
            return True
        if text.lower() in FALSE_WORDS:
            return False
        raise refuse("a bool (accepted: true/false, 1/0, yes/no, any case)")
    for kind, accepted in ((int, "an int (e.g. 2)"), (float, "a number (e.g. 0.5)")):
        if isinstance(default, kind):
            try:
                return kind(text)
            except ValueError:
                raise refuse(accepted) from None
    return value if isinstance(default, str) else _parse_value(value)


def convert_parameters(parameters: dict, defaults: dict, notebook: str = "") -> dict:
    """The parameters this notebook declares, each converted by the notebook's own default."""
    return {
        k: convert_parameter(k, v, defaults[k], notebook) for k, v in parameters.items() if k in defaults
    }


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def numbers_between(low: float, high: float, *, inclusive: bool = True, **params) -> None:
    """Every keyword is a number in [low, high] (``inclusive``) or in (low, high)."""
    for name, value in params.items():
        inside = _is_number(value) and (low <= value <= high if inclusive else low < value < high)
        if not inside:
            span = f"[{low}, {high}]" if inclusive else f"({low}, {high})"
            raise ParameterError(f"parameter {name}={value!r} is invalid; accepted: a number in {span}")
