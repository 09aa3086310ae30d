import pytest

from nbtools import OutputMismatch
from nbtools.ranks import assert_block, block_keys, keyed_lines, strip_rank_prefix

BLOCK = """
world=2
device=npu
gathered=[1, 2, 3, 1, 2, 3]
"""


def test_strip_rank_prefix_removes_torch_elastic_prefixes_only():
    text = "[rank0]: world=2\n[default1]:device=npu\nplain [rank3]: stays\n[rankX]: stays too"
    assert strip_rank_prefix(text) == "world=2\ndevice=npu\nplain [rank3]: stays\n[rankX]: stays too"


def test_block_keys_in_order_once_each():
    assert block_keys(BLOCK) == ["world", "device", "gathered"]
    assert block_keys("a=1 b=2\nprose\na=3") == ["a"]


def test_keyed_lines_drop_other_ranks_warnings_between_the_lines():
    out = (
        "The following values were not passed to `accelerate launch`...\n"
        "world=2\n"
        "[rank1]: UserWarning: something on rank 1\n"
        "device=npu\n"
        "[rank0]: gathered=[1, 2, 3, 1, 2, 3]\n"
        "worldwide=3\n"
    )
    assert keyed_lines(out, ["world", "device", "gathered"]) == "world=2\ndevice=npu\ngathered=[1, 2, 3, 1, 2, 3]"
    assert_block(BLOCK, out)


def test_a_line_printed_by_every_process_is_a_mismatch():
    # Two processes that each ran alone: both think they are the main process.
    alone = "world=1\nworld=1\ndevice=npu\ndevice=npu\ngathered=[1, 2, 3]\ngathered=[1, 2, 3]\n"
    with pytest.raises(OutputMismatch):
        assert_block(BLOCK, alone)
    twice = "world=2\ndevice=npu\ngathered=[1, 2, 3, 1, 2, 3]\n" * 2
    with pytest.raises(OutputMismatch):
        assert_block(BLOCK, twice)


def test_wrong_value_missing_line_and_wrong_order_fail():
    with pytest.raises(OutputMismatch, match="gathered"):
        assert_block(BLOCK, "world=2\ndevice=npu\ngathered=[1, 2, 3]\n")
    with pytest.raises(OutputMismatch):
        assert_block(BLOCK, "world=2\ndevice=npu\n")
    with pytest.raises(OutputMismatch):
        assert_block(BLOCK, "device=npu\nworld=2\ngathered=[1, 2, 3, 1, 2, 3]\n")


def test_in_line_wildcard_works_and_a_block_without_keys_is_refused():
    assert_block("device=npu final_loss=xxx", "noise\ndevice=npu final_loss=0.12\n")
    with pytest.raises(ValueError):
        assert_block("Python 3.12.xxx", "Python 3.12.1")
    with pytest.raises(ValueError):
        assert_block("...\nworld=2\n...", "world=2")
