"""nbtools.ranks: rank lines read like expected blocks, which samples are padding, and the pictures."""

import matplotlib
import pytest

from nbtools import OutputMismatch
from nbtools.ranks import (
    PADDING,
    REAL,
    REDUCED,
    assert_block,
    block_keys,
    draw_collectives,
    draw_rank_step_grid,
    keyed_lines,
    padding_marks,
)

matplotlib.use("Agg")

BLOCK = """
world=2
device=npu
gathered=[1, 2, 3, 1, 2, 3]
"""


def test_keyed_lines_remove_torch_elastic_prefixes_only():
    text = "[rank0]: world=2\n[default1]:device=npu\nplain [rank3]: device=cpu\n[rankX]: world=3"
    assert keyed_lines(text, ["world", "device"]) == "world=2\ndevice=npu"


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



def _faces(ax):
    return [matplotlib.colors.to_hex(p.get_facecolor()) for p in ax.patches]


def _texts(ax):
    return [t.get_text() for t in ax.texts]


def test_grid_has_one_cell_per_sample_and_marks_the_padding():
    steps = [[[0, 1, 2, 3], [8, 9, 0, 1]], [[4, 5, 6, 7], [2, 3, 4, 5]]]
    fig = draw_rank_step_grid(steps, 10, title="N=10")
    ax = fig.axes[0]
    faces = _faces(ax)
    assert len(faces) == 16
    assert faces.count(PADDING) == 6 and faces.count(REAL) == 10
    assert [t for t in _texts(ax) if t.startswith("step")] == ["step 0", "step 1"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0", "rank 1"]


def test_collectives_show_the_gathered_and_the_summed_values():
    fig = draw_collectives([[1, 2, 3], [1, 2, 3]])
    gather_ax, reduce_ax = fig.axes
    numbers = [t for t in _texts(gather_ax) if t.isdigit()]
    assert numbers == ["1", "2", "3", "1", "2", "3", "1", "2", "3"] * 2  # holds, then the gathered list, per rank
    assert [t for t in _texts(reduce_ax) if t.isdigit()] == ["1", "2", "3", "2", "4", "6"] * 2  # holds, then the sum
    assert _faces(reduce_ax).count(REDUCED) == 6


def test_collectives_refuse_ragged_input():
    with pytest.raises(ValueError):
        draw_collectives([[1, 2], [1]])


# What accelerate's prepared DataLoader gave 2 ranks for 10 samples, batch 4 (measured on CPU).
TWO = [[[0, 1, 2, 3], [8, 9, 0, 1]], [[4, 5, 6, 7], [2, 3, 4, 5]]]
ONE = [[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]]


def test_padding_is_what_lies_past_n_in_the_gathered_order():
    assert padding_marks(TWO, 10) == [
        [[False] * 4, [False, False, True, True]],
        [[False] * 4, [True] * 4],
    ]
    assert padding_marks(ONE, 10) == [[[False] * 4, [False] * 4, [False] * 2]]


def test_block_keys_and_parse_kv_read_one_key_rule():
    """A key may hold dots and dashes (``model.dtype=``, ``num-procs=``): the expected block's keys and the printed
    pairs are read by the same rule (expected.KEY)."""
    from nbtools.expected import parse_kv

    line = "model.dtype=bf16 num-procs=2"
    assert block_keys(line) == ["model.dtype"] and list(parse_kv(line)) == ["model.dtype", "num-procs"]
