import pytest

from nbtools import OutputMismatch, assert_matches, match, parse_kv


def test_in_line_wildcard_matches_within_a_line_only():
    assert match("device=npu final_loss=xxx", "device=npu final_loss=0.1234")
    assert not match("device=npu final_loss=xxx", "device=cpu final_loss=0.1234")
    assert not match("Python 3.12.xxx", "Python 3.12.1\nextra line")


def test_any_lines_wildcard_matches_zero_or_more_lines():
    exp = "...\nworld=2\n..."
    assert match(exp, "world=2")
    assert match(exp, "warning a\nwarning b\nworld=2\ntrailer")
    assert not match(exp, "world=1")


def test_seed_acc_env_block():
    exp = """...
Copy-and-paste the text below in your GitHub issue
- `Accelerate` version: xxx
- PyTorch accelerator: NPU
..."""
    out = "\nCopy-and-paste the text below in your GitHub issue\n\n- `Accelerate` version: 1.15.0\n- PyTorch accelerator: NPU\n- CANN version: 9.1.0\n"
    assert match(exp, out)
    assert not match(exp, out.replace("NPU", "N/A"))


def test_failure_shows_both_sides_and_first_difference():
    with pytest.raises(OutputMismatch) as err:
        assert_matches("a=1\nb=2\nc=3", "a=1\nb=5\nc=3")
    text = str(err.value)
    assert "expected" in text and "actual" in text
    assert "first difference: expected line 2 'b=2' vs output line 2 'b=5'" in text
    assert isinstance(err.value, AssertionError)


def test_extra_output_is_a_mismatch():
    m = match("a", "a\nb")
    assert not m
    assert "<end of expected block>" in m.report()


def test_parse_kv_reads_pairs_and_ignores_prose():
    text = (
        "device=npu final_loss=0.0123\n"
        "gathered=[1, 2, 3, 1, 2, 3]\n"
        "[rank0]: world=2\n"
        "some prose with a=b inside\n"
        "- PyTorch accelerator: N/A\n"
    )
    assert parse_kv(text) == {
        "device": "npu",
        "final_loss": "0.0123",
        "gathered": "[1, 2, 3, 1, 2, 3]",
        "world": "2",
    }
