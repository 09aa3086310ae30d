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


def test_each_rule_is_written_once_and_every_caller_says_the_same():
    """The count, device and precision rules and the cards a launch uses live in nbtools/decide.py, the reading of a
    visible-card variable in device.py; params.validate, the route, a written launch and the session call them. Writing one of them again elsewhere fails here; test_normaliser.py
    finds a restatement by meaning (the single source changed, every entry point follows)."""
    import inspect
    from pathlib import Path

    import nbtools
    from nbtools import decide, params
    from nbtools.decide import launch_spec, precisions_on
    from nbtools.device import from_probe

    cpu = from_probe({"python": "3.11.7", "torch": "2.13.0+cpu", "cuda_available": False, "cuda_count": 0}, environ={})
    said = set()
    for call in (lambda: params.validate(num_processes=0, info=cpu), lambda: decide.plan(cpu, 0),
                 lambda: launch_spec(decide.parse_launch("accelerate launch --num_processes 0 train.py"), info=cpu)):
        with pytest.raises(ParameterError, match=r"num_processes=0 is invalid; accepted: an integer >= 1$") as err:
            call()
        said.add(str(err.value).split("num_processes")[1])
    assert len(said) == 1
    for call in (lambda: params.validate(device="tpu", info=cpu), lambda: decide.resolve(cpu, "tpu")):
        with pytest.raises(ParameterError, match=r"^parameter device='tpu' is not known; accepted: 'auto', 'npu'"):
            call()
    with pytest.raises(ParameterError, match=r"accepted here: no, bf16$"):
        params.validate(mixed_precision="fp16", info=cpu)
    assert cpu.mixed_precisions == precisions_on("cpu", cpu.bf16) == ("no", "bf16")
    sources = {p.name: p.read_text(encoding="utf-8") for p in Path(nbtools.__file__).parent.glob("*.py")}
    homes = {"integer >= {minimum}": "decide.py", '("auto", *KINDS)': "decide.py", "p != \"fp16\"": "decide.py",
             'split(",")': "device.py", "after + n - len(ids)": "decide.py"}
    for rule, home in homes.items():
        assert [name for name, text in sources.items() if rule in text] == [home], rule
    assert "isinstance(value, bool) or not isinstance(value, int)" not in inspect.getsource(params)


@pytest.mark.parametrize("port", ["abc", "0", "70000"])
def test_a_written_port_that_is_no_port_number_is_a_parameter_error(port, tmp_path):
    from nbtools.decide import launch_spec, parse_launch
    from nbtools.device import from_probe

    cpu = from_probe({"python": "3.11.7", "torch": "2.13.0+cpu", "cuda_available": False, "cuda_count": 0}, environ={})
    call = parse_launch(f"accelerate launch --num_processes 2 --main_process_port {port} train.py")
    with pytest.raises(ParameterError, match=rf"--main_process_port='{port}' is invalid; accepted: a port number 1-65535"):
        launch_spec(call, info=cpu, cwd=tmp_path)
    assert launch_spec(parse_launch("accelerate launch --main_process_port 29501 t.py"), info=cpu, cwd=tmp_path).port == 29501
