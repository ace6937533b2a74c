"""Sharding a campaign's draws: shard ``index`` of ``count`` gets its own Hypothesis seeds and its
own case seeds, so N processes (``--workers``, a job array with ``--shard``, pytest-xdist items)
fuzz the same backends on disjoint examples with no coordination.

* Hypothesis seeds: chunk ``j`` of the shard runs ``seed(base + index + count * j)``, so shards
  interleave the chunk seeds of one unsharded campaign and never share one;
* case seeds (what the tensors are made from): a drawn seed ``s`` becomes ``s * count + index``,
  so two shards never run the same case, even when Hypothesis draws the same layout in both;
* example budgets: ``share(total)`` splits a total so that the shards add up to it.

With ``count == 1`` both maps are the identity: an unsharded campaign draws what it always drew.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# More shards than this is no job array a campaign runs (Slurm's default MaxArraySize is 1001): a
# mistyped count, whose --merge would wait for (and list) millions of shards that never come.
MAX_SHARDS = 4096


@dataclass(frozen=True)
class Shard:
    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.index, bool) or isinstance(self.count, bool) or not isinstance(self.index, int) \
                or not isinstance(self.count, int):
            raise ValueError(f"a shard is INDEX/COUNT of whole numbers, got {self.index!r}/{self.count!r}")
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ValueError(f"a shard is INDEX/COUNT with 0 <= INDEX < COUNT, got {self.index}/{self.count}")
        if self.count > MAX_SHARDS:
            raise ValueError(f"a shard is INDEX/COUNT with COUNT at most {MAX_SHARDS}, got {self.index}/{self.count}")

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``"2/8"`` -> ``Shard(2, 8)`` (ASCII digits; spaces around them are allowed)."""
        m = re.fullmatch(r"\s*(\d{1,9})\s*/\s*(\d{1,9})\s*", text, re.ASCII) if isinstance(text, str) else None
        if m is None:
            raise ValueError(f"a shard is INDEX/COUNT, e.g. 0/4; got {text!r}")
        return cls(int(m[1]), int(m[2]))

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def chunk_seed(self, base_seed: int, chunk: int) -> int:
        """The Hypothesis seed of this shard's ``chunk``-th chunk.

        >>> [Shard(1, 3).chunk_seed(100, j) for j in range(3)]
        [101, 104, 107]
        """
        return base_seed + self.index + self.count * chunk

    def case_seed(self, drawn: int) -> int:
        """The tensor seed of a case whose strategy drew ``drawn`` (distinct per shard).

        >>> Shard(0, 2).case_seed(7), Shard(1, 2).case_seed(7)
        (14, 15)
        """
        return drawn * self.count + self.index

    def share(self, total: int) -> int:
        """This shard's part of ``total`` (the parts of all shards add up to ``total``).

        >>> [Shard(i, 3).share(10) for i in range(3)]
        [4, 3, 3]
        """
        return total // self.count + (self.index < total % self.count)
