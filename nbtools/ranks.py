"""What a launch's ranks print and hold, for notebooks 02 / 02b / 04-06.

- ``keyed_lines`` / ``assert_block``: the ``key=value`` lines an expected block speaks about, with
  torch elastic's ``[rank1]:`` / ``[default1]:`` prefixes removed, compared line for line; another
  rank's warning between them does not matter, a line printed twice (each process ran alone) does.
- ``padding_marks``: which samples of ``steps[rank][step]`` (each rank's batches) are the repeats
  that fill the last round; ``gather_for_metrics`` drops exactly those.
- ``draw_collectives`` / ``draw_rank_step_grid``: matplotlib pictures of what every rank holds
  around all-gather and all-reduce, and of who evaluated which sample (imported when drawn).
"""

from __future__ import annotations

import re

from .expected import ANY_LINES, KEY, RANK_PREFIX, assert_matches
from .lang import msg

_KEY = re.compile(rf"^\s*({KEY})=")


def block_keys(block: str) -> list[str]:
    """The keys an expected block's lines start with (``world=2`` -> ``world``), in order, once each."""
    return list(dict.fromkeys(m.group(1) for line in block.splitlines() if (m := _KEY.match(line))))


def keyed_lines(output: str, keys) -> str:
    """The lines of ``output`` that start with ``key=`` for one of ``keys``, prefixes removed, in order."""
    wanted = tuple(f"{k}=" for k in keys)
    lines = (RANK_PREFIX.sub("", line).strip() for line in output.splitlines())
    return "\n".join(line for line in lines if line.startswith(wanted))


def assert_block(block: str, output: str, what: str | None = None) -> None:
    """Raise OutputMismatch unless the block's ``key=`` lines of ``output`` match ``block`` (xxx allowed).

    Lines about other keys, and other ranks' warnings, are ignored, as in the quick-start's
    ``fuzzy='...'`` blocks; every line the block names must appear exactly as often as it does there.
    """
    keys = block_keys(block)
    if not keys:
        raise ValueError(f"the expected block names no key=value line: {block!r}")
    if any(line.strip() == ANY_LINES for line in block.splitlines()):
        raise ValueError("assert_block already ignores other lines: leave '...' out of the block")
    keyed = msg("list_sep").join(k + "=" for k in keys)
    assert_matches(block, keyed_lines(output, keys), what=msg("ranks.lines_of", what=what or msg("ranks.output"), keys=keyed))


REAL = "#cfe0f5"
PADDING = "#f4b183"
REDUCED = "#c7e9c0"
RANK_COLORS = ("#cfe0f5", "#fde2b8", "#d9ead3", "#ead1dc", "#d0e0e3", "#fff2cc", "#e6d7f2", "#f4cccc")
EDGE = "#33415c"


def _cells(ax, x0: float, y: float, values, color: str, hatch: str | None = None) -> None:
    from matplotlib.patches import Rectangle

    for j, v in enumerate(values):
        ax.add_patch(Rectangle((x0 + j, y - 0.4), 0.92, 0.8, facecolor=color, edgecolor=EDGE, hatch=hatch))
        ax.text(x0 + j + 0.46, y, str(v), ha="center", va="center", fontsize=9)


def draw_collectives(chunks: list[list], title: str = ""):
    """Two panels, ranks as rows: each rank's tensor -> all-gather, and the same -> all-reduce (sum).

    ``chunks[k]`` is rank k's tensor as a list of numbers, e.g. the gathered list split into
    equal parts. Returns the Figure.
    """
    import matplotlib.pyplot as plt

    if not chunks or any(len(c) != len(chunks[0]) for c in chunks):
        raise ValueError(f"expected one equally long list per rank, got {chunks!r}")
    world, length = len(chunks), len(chunks[0])
    color = [RANK_COLORS[k % len(RANK_COLORS)] for k in range(world)]  # rank k's numbers keep rank k's colour
    panels = (("all-gather: gather / gather_for_metrics", [v for c in chunks for v in c], True),
              ("all-reduce (sum): reduce", [sum(col) for col in zip(*chunks)], False))
    widths = [length + 2 + len(out) for _, out, _ in panels]
    fig, axes = plt.subplots(1, 2, figsize=(0.4 * sum(widths) + 2.2, 0.55 * world + 1.3), width_ratios=widths)
    for ax, (head, out, by_rank) in zip(axes, panels):
        x_out = length + 2
        for k, chunk in enumerate(chunks):
            _cells(ax, 0, -k, chunk, color[k])
            if by_rank:
                for src in range(world):
                    _cells(ax, x_out + src * length, -k, chunks[src], color[src])
            else:
                _cells(ax, x_out, -k, out, REDUCED)
            ax.annotate("", xy=(x_out - 0.15, -k), xytext=(length + 0.1, -k), arrowprops={"arrowstyle": "->"})
        ax.text(0, 0.6, "each rank holds", ha="left", va="bottom", fontsize=9)
        ax.text(x_out, 0.6, "every rank then holds", ha="left", va="bottom", fontsize=9)
        ax.set_title(head, fontsize=10, weight="bold")
        _rank_rows(ax, world, x_out + len(out) + 0.3, 1.3)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def _rank_rows(ax, world: int, right: float, top: float) -> None:
    """One row per rank (``rank 0`` at the top), no x ticks, no frame."""
    ax.set_yticks([-k for k in range(world)], [f"rank {k}" for k in range(world)])
    ax.set(xticks=[], xlim=(-0.3, right), ylim=(-world + 0.3, top))
    ax.spines[:].set_visible(False)


def draw_rank_step_grid(steps: list[list[list[int]]], n: int, title: str = ""):
    """Rank x step grid of the sample indices each rank evaluated; padding hatched. Returns the Figure.

    ``steps[rank][step]`` is that rank's batch at that step; ``n`` the dataset size.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    n_steps = max((len(s) for s in steps), default=0)
    width = max((len(b) for s in steps for b in s), default=1)
    units = n_steps * (width + 1)
    fig, ax = plt.subplots(figsize=(max(5.5, 0.5 * units + 1.5), 0.6 * len(steps) + 1.7))
    for k, (rank_steps, rank_marks) in enumerate(zip(steps, padding_marks(steps, n))):
        for s, (batch, pads) in enumerate(zip(rank_steps, rank_marks)):
            for j, (index, pad) in enumerate(zip(batch, pads)):
                _cells(ax, s * (width + 1) + j, -k, [index], PADDING if pad else REAL, "//" if pad else None)
    for s in range(n_steps):
        ax.text(s * (width + 1) + width / 2, 0.6, f"step {s}", ha="center", va="bottom", fontsize=9)
    _rank_rows(ax, len(steps), units, 1.2)
    ax.set_aspect("equal")
    legend = [Patch(facecolor=REAL, edgecolor=EDGE, label="sample that counts"),
              Patch(facecolor=PADDING, edgecolor=EDGE, hatch="//", label="padding: gather_for_metrics drops it")]
    ax.legend(handles=legend, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2, fontsize=8, frameon=False)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def padding_marks(steps: list[list[list[int]]], n: int) -> list[list[list[bool]]]:
    """Same shape as ``steps``: True where the sample sits at position >= ``n`` in the gathered order."""
    marks, position = [[[] for _ in rank_steps] for rank_steps in steps], 0
    for s in range(max((len(rank_steps) for rank_steps in steps), default=0)):
        for rank_steps, rank_marks in zip(steps, marks):
            if s < len(rank_steps):  # rank by rank within a step: the order gather puts them in
                rank_marks[s] = [position + j >= n for j in range(len(rank_steps[s]))]
                position += len(rank_steps[s])
    return marks
