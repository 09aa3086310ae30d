"""Checks for a notebook's own parameters (``nbtools.setup`` checks the common ones).

Each raises ``ParameterError`` naming the parameter, its value and what is accepted, before any
process starts: ``whole_numbers(1, epochs=epochs, hidden=hidden)``,
``numbers_between(0, 1, inclusive=False, test_size=test_size)``.
"""

from __future__ import annotations

import math

from .errors import ParameterError


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def whole_numbers(minimum: int = 1, **params) -> None:
    """Every keyword is an integer (not a bool) >= ``minimum``."""
    for name, value in params.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ParameterError(f"parameter {name}={value!r} is invalid; accepted: an integer >= {minimum}")


def numbers_between(low: float, high: float, *, inclusive: bool = True, **params) -> None:
    """Every keyword is a number in [low, high] (``inclusive``) or in (low, high)."""
    for name, value in params.items():
        inside = _is_number(value) and (low <= value <= high if inclusive else low < value < high)
        if not inside:
            span = f"[{low}, {high}]" if inclusive else f"({low}, {high})"
            raise ParameterError(f"parameter {name}={value!r} is invalid; accepted: a number in {span}")
