"""Notebook parameters: ``-p NAME=VALUE`` converted by each notebook's defaults, and the checks for a notebook's
own parameters (the common ones, ``validate``, are decide.py's; the work folder is workdir.py's).

Checks for a notebook's own parameters (``nbtools.setup`` checks the common ones).

Each raises ``ParameterError`` naming the parameter, its value and what is accepted, before any
process starts: ``whole_numbers(1, epochs=epochs, hidden=hidden)``,
``numbers_between(0, 1, inclusive=False, test_size=test_size)``.
"""

from __future__ import annotations

import ast
import math
import os

# The parameter rules live with the launch rule they serve (decide.py); the notebooks import whole_numbers from here
from .decide import DEFAULT_TIMEOUT_S, known_device, validate, whole_numbers  # noqa: F401
from .errors import ParameterError

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
