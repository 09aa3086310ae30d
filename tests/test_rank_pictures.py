import matplotlib
import pytest

matplotlib.use("Agg")

from nbtools.ranks import PADDING, REAL, REDUCED, draw_collectives, draw_rank_step_grid  # noqa: E402


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
