"""The ``shift`` rule kind: a CUSUM of block medians against the series' own longer past.

A change detector whose false-alarm rate is measured (``bench/alert_calibration.py``) rather
than hoped for. The series is cut into blocks of ``block`` finite values; each block is summed
up by its median (one wild value moves it little: heavy-tailed noise), and judged against a
reference: the medians of the ``reference`` blocks before it, leaving out the ``gap`` blocks
just before it (a change that creeps in is not yet part of what it is judged against). Its
standard score is ``z = (median - reference median) / reference sd``, where the sd is the
spread of the reference's block medians themselves: that measures how far a block's median
wanders in this series, autocorrelation and trend included, with no model of the noise
(the batch-means idea). The sd is floored at ``floor`` times the reference median's size, so
a series that was constant is judged against a small share of its level, not against zero.

Page's one-sided CUSUM accumulates the evidence, ``S = max(0, S + d·z - slack)`` (``d`` is +1
watching for a rise, -1 for a drop), and the condition holds while ``S > limit``: one block
``slack + limit`` sds out fires at once; a smaller shift that lasts fires a few blocks later.
While the rule fires, the reference is held as it was before the shift, so the alert stays
until the series is back in its earlier range (or the run ends), and its evidence says
against what it was judged.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import statistics
from collections.abc import Callable, Iterator, Sequence

#: the CUSUM is kept at most this many limits high, so a series that comes back after a long
#: drop is recognised within a few blocks
CUSUM_CAP = 2.0


@dataclasses.dataclass(frozen=True)
class ShiftParams:
    """A ``shift`` rule's numbers (see the module docstring)."""

    block: int
    reference: int
    gap: int
    slack: float
    limit: float
    floor: float
    direction: str  #: above | below | both


@dataclasses.dataclass
class Verdict:
    """One evaluation of a ``shift`` rule: at the end of a block."""

    index: int  #: position in the column of the block's last value
    holds: bool
    median: float
    why: str


@dataclasses.dataclass
class ShiftState:
    """What a ``shift`` rule keeps of one series (checkpointed with the engine's state)."""

    pending: list[float] = dataclasses.field(default_factory=list)
    pending_first_step: int | None = None
    #: the latest blocks: (median, first step, last step)
    blocks: collections.deque[tuple[float, int | None, int | None]] = dataclasses.field(
        default_factory=collections.deque
    )
    low: float = 0.0  #: the CUSUM for a drop
    high: float = 0.0  #: the CUSUM for a rise
    #: while the rule fires: the reference it fired against (median, sd, first and last step)
    held: tuple[float, float, int | None, int | None] | None = None

    def feed(
        self,
        p: ShiftParams,
        values: Sequence[float],
        steps: Sequence[int | None],
        firing: Callable[[], bool],
    ) -> Iterator[Verdict]:
        """Take a column's values; a verdict for each block it completes, as it completes it.

        ``firing`` says whether the rule fires now: the caller applies each verdict before it
        asks for the next, so a block after one that fired is judged against the held reference.
        """
        if math.isfinite(sum(values)):
            at: Sequence[int] = range(len(values))
        else:  # NaN is the nonfinite rule's business
            at = [i for i, v in enumerate(values) if math.isfinite(v)]
            values = [values[i] for i in at]
        pending = self.pending
        pos, n = 0, len(values)
        while pos < n:
            if not pending:
                self.pending_first_step = steps[at[pos]]
            take = values[pos : pos + p.block - len(pending)]
            pending.extend(take)
            pos += len(take)
            if len(pending) < p.block:
                break
            i = at[pos - 1]
            verdict = self._judge(p, i, statistics.median(pending), steps[i], firing())
            pending.clear()
            if verdict is not None:
                yield verdict

    def _judge(
        self, p: ShiftParams, index: int, median: float, last_step: int | None, firing: bool
    ) -> Verdict | None:
        block = (median, self.pending_first_step, last_step)
        reference = self.held or self._reference(p)
        if reference is None:
            self._keep(p, block)
            return None
        loc, sd, first, last = reference
        z = (median - loc) / sd
        self.low = min(max(0.0, self.low - z - p.slack), CUSUM_CAP * p.limit)
        self.high = min(max(0.0, self.high + z - p.slack), CUSUM_CAP * p.limit)
        cusum = {"below": self.low, "above": self.high}.get(p.direction, max(self.low, self.high))
        holds = cusum > p.limit
        if holds and self.held is None:
            self.held = reference  # judged against the past before the shift until it is over
        elif not holds and not firing:
            self.held = None  # held for a block that did not fire (``for`` > 1): let go
        if self.held is None:
            self._keep(p, block)
        side = "below" if z < 0 else "above"
        why = (
            f"median {median:.4g} of steps {_span(block[1], block[2])} is {abs(z):.1f} sd {side} "
            f"the median {loc:.4g} of steps {_span(first, last)} (sd {sd:.3g}); "
            f"CUSUM {cusum:.1f} {'>' if holds else '<='} {p.limit:g}"
        )
        return Verdict(index, holds, median, why)

    def release(self) -> None:
        """The alert resolved: the blocks from now on join the reference again."""
        self.held = None

    def _keep(self, p: ShiftParams, block: tuple[float, int | None, int | None]) -> None:
        self.blocks.append(block)
        while len(self.blocks) > p.reference + p.gap:
            self.blocks.popleft()

    def _reference(self, p: ShiftParams) -> tuple[float, float, int | None, int | None] | None:
        """(median, sd, first step, last step) of the reference, or None while it is not full."""
        if len(self.blocks) < p.reference + p.gap:
            return None
        ref = list(self.blocks)[: p.reference]
        medians = [b[0] for b in ref]
        loc = statistics.median(medians)
        mean = sum(medians) / len(medians)
        var = sum([(m - mean) ** 2 for m in medians]) / (len(medians) - 1)
        sd = max(math.sqrt(var), p.floor * abs(loc), 1e-12 * (1.0 + abs(loc)))
        return loc, sd, ref[0][1], ref[-1][2]


def _span(first: int | None, last: int | None) -> str:
    return f"{first}-{last}" if first != last else str(first)
