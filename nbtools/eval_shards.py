"""Which samples each rank evaluated, and which of them are the padding ``gather_for_metrics`` drops.

A worker script prints, per rank, the sample indices of every step (``steps[rank][step]`` =
that rank's batch at that step, padding included; e.g. from ``gather_object([steps])``).
``accelerator.gather`` concatenates the ranks' batches step by step, in rank order; with a
prepared DataLoader (``even_batches=True``) the samples past the dataset's ``n`` in that order
are the repeats that fill the last round, and ``gather_for_metrics`` drops exactly those.
"""

from __future__ import annotations

from dataclasses import dataclass


def gather_order(steps: list[list[list[int]]]) -> list[int]:
    """The indices in the order ``accelerator.gather`` returns them: step by step, ranks in order."""
    n_steps = max((len(rank_steps) for rank_steps in steps), default=0)
    out: list[int] = []
    for s in range(n_steps):
        for rank_steps in steps:
            if s < len(rank_steps):
                out += list(rank_steps[s])
    return out


def padding_marks(steps: list[list[list[int]]], n: int) -> list[list[list[bool]]]:
    """Same shape as ``steps``: True where the sample sits at position >= ``n`` in the gathered order."""
    n_steps = max((len(rank_steps) for rank_steps in steps), default=0)
    marks = [[[False] * len(batch) for batch in rank_steps] for rank_steps in steps]
    position = 0
    for s in range(n_steps):
        for rank, rank_steps in enumerate(steps):
            if s < len(rank_steps):
                for j in range(len(rank_steps[s])):
                    marks[rank][s][j] = position >= n
                    position += 1
    return marks


@dataclass
class Shards:
    real: list[list[int]]  # per rank: the samples that count, in the order the rank saw them
    padding: list[list[int]]  # per rank: the repeats gather_for_metrics drops

    @property
    def all_real(self) -> list[int]:
        return [i for part in self.real for i in part]

    @property
    def all_padding(self) -> list[int]:
        return [i for part in self.padding for i in part]

    def overlaps(self) -> dict[tuple[int, int], set[int]]:
        """Pairs of ranks whose real samples share indices (empty when the shards are disjoint)."""
        out = {}
        for a in range(len(self.real)):
            for b in range(a + 1, len(self.real)):
                common = set(self.real[a]) & set(self.real[b])
                if common:
                    out[(a, b)] = common
        return out


def split_shards(steps: list[list[list[int]]], n: int) -> Shards:
    """Each rank's samples, split into the real ones and the padding (see ``padding_marks``)."""
    marks = padding_marks(steps, n)
    real = [[i for batch, m in zip(rs, ms) for i, pad in zip(batch, m) if not pad] for rs, ms in zip(steps, marks)]
    padding = [[i for batch, m in zip(rs, ms) for i, pad in zip(batch, m) if pad] for rs, ms in zip(steps, marks)]
    return Shards(real, padding)

