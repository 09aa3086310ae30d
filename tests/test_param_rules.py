import math

import pytest

from nbtools import ParameterError
from nbtools.params import numbers_between, whole_numbers


def test_whole_numbers_accept_integers_at_or_above_the_minimum():
    whole_numbers(1, epochs=1, hidden=512)
    whole_numbers(0, seed=0)


@pytest.mark.parametrize("value", [0, -3, 2.0, "2", True, None])
def test_whole_numbers_refuse_and_name_the_parameter(value):
    with pytest.raises(ParameterError, match=r"parameter epochs=.* accepted: an integer >= 1"):
        whole_numbers(1, hidden=64, epochs=value)


def test_numbers_between_closed_and_open():
    numbers_between(0, 1, min_accuracy=0)
    numbers_between(0, 1, min_accuracy=1.0)
    numbers_between(0, 1, inclusive=False, test_size=0.2)
    numbers_between(0, math.inf, inclusive=False, lr=1e-3)
    with pytest.raises(ParameterError, match=r"test_size=1 .*\(0, 1\)"):
        numbers_between(0, 1, inclusive=False, test_size=1)
    with pytest.raises(ParameterError, match=r"lr=0"):
        numbers_between(0, math.inf, inclusive=False, lr=0)
    for bad in ("0.5", True, float("nan"), None):
        with pytest.raises(ParameterError):
            numbers_between(0, 1, min_accuracy=bad)
