"""Pictures of what each rank holds, drawn with matplotlib from a run's own numbers.

- ``draw_collectives``: what every rank holds before a collective, after all-gather (what
  ``gather_for_metrics`` / ``gather`` do) and after all-reduce with a sum (``accelerator.reduce``).
- ``draw_rank_step_grid``: rank x step, every sample a rank evaluated, the padding that
  ``gather_for_metrics`` drops marked (see eval_shards.py).

matplotlib is imported when a picture is drawn, never when nbtools is imported.
"""

from __future__ import annotations

from .eval_shards import padding_marks

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
    gathered = [v for c in chunks for v in c]
    reduced = [sum(col) for col in zip(*chunks)]
    color = [RANK_COLORS[k % len(RANK_COLORS)] for k in range(world)]  # rank k's numbers keep rank k's colour
    panels = (("all-gather: gather / gather_for_metrics", gathered, True), ("all-reduce (sum): reduce", reduced, False))
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
        ax.set_yticks([-k for k in range(world)], [f"rank {k}" for k in range(world)])
        ax.set_xticks([])
        ax.set_xlim(-0.3, x_out + len(out) + 0.3)
        ax.set_ylim(-world + 0.3, 1.3)
        for side in ("top", "right", "bottom", "left"):
            ax.spines[side].set_visible(False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def draw_rank_step_grid(steps: list[list[list[int]]], n: int, title: str = ""):
    """Rank x step grid of the sample indices each rank evaluated; padding hatched. Returns the Figure.

    ``steps[rank][step]`` is that rank's batch at that step; ``n`` the dataset size.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    marks = padding_marks(steps, n)
    world = len(steps)
    n_steps = max((len(s) for s in steps), default=0)
    width = max((len(b) for s in steps for b in s), default=1)
    units = n_steps * (width + 1)
    fig, ax = plt.subplots(figsize=(max(5.5, 0.5 * units + 1.5), 0.6 * world + 1.7))
    for k, (rank_steps, rank_marks) in enumerate(zip(steps, marks)):
        for s, (batch, pads) in enumerate(zip(rank_steps, rank_marks)):
            x0 = s * (width + 1)
            for j, (index, pad) in enumerate(zip(batch, pads)):
                _cells(ax, x0 + j, -k, [index], PADDING if pad else REAL, "//" if pad else None)
    for s in range(n_steps):
        ax.text(s * (width + 1) + width / 2, 0.6, f"step {s}", ha="center", va="bottom", fontsize=9)
    ax.set_yticks([-k for k in range(world)], [f"rank {k}" for k in range(world)])
    ax.set_xticks([])
    ax.set_xlim(-0.3, units)
    ax.set_ylim(-world + 0.3, 1.2)
    ax.set_aspect("equal")
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    legend = [
        Patch(facecolor=REAL, edgecolor=EDGE, label="sample that counts"),
        Patch(facecolor=PADDING, edgecolor=EDGE, hatch="//", label="padding: gather_for_metrics drops it"),
    ]
    ax.legend(handles=legend, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2, fontsize=8, frameon=False)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig
