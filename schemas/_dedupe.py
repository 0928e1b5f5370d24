"""Which (producer_id, seq) pairs a sink already holds: duplicates dropped, gaps reported.

Per producer, a sorted list of disjoint closed intervals of seen seqs. In-order delivery
(the normal case) only ever extends the last interval, so the check is O(1); a redelivery
after a crash or a reordered retry lands in the slow path and is still exact.

:class:`RecordDigests` tells a repeated record from a forged one with the same identities.
"""

from __future__ import annotations

import bisect
import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

from ._errors import ForgedRepeatError

Interval = tuple[int, int]


class SeqSet:
    """The seqs seen from one producer, as disjoint intervals."""

    __slots__ = ("_starts", "_ends")

    def __init__(self, intervals: Iterable[Interval] = ()) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        self.merge(intervals)

    def __contains__(self, seq: int) -> bool:
        i = bisect.bisect_right(self._starts, seq) - 1
        return i >= 0 and seq <= self._ends[i]

    def add(self, seq: int) -> bool:
        """Record ``seq``; return False if it was already there (a duplicate)."""
        ends = self._ends
        if ends and ends[-1] + 1 == seq:  # the hot path: the next event in order
            ends[-1] = seq
            return True
        starts = self._starts
        i = bisect.bisect_right(starts, seq) - 1
        if i >= 0 and seq <= ends[i]:
            return False
        joins_left = i >= 0 and ends[i] + 1 == seq
        joins_right = i + 1 < len(starts) and starts[i + 1] - 1 == seq
        if joins_left and joins_right:
            ends[i] = ends[i + 1]
            del starts[i + 1], ends[i + 1]
        elif joins_left:
            ends[i] = seq
        elif joins_right:
            starts[i + 1] = seq
        else:
            starts.insert(i + 1, seq)
            ends.insert(i + 1, seq)
        return True

    def add_range(self, start: int, end: int) -> bool:
        """Record every seq of ``[start, end]`` if none was seen; else record nothing, return False."""
        ends = self._ends
        if ends and ends[-1] + 1 == start:  # the hot path: the next batch in order
            ends[-1] = end
            return True
        i = bisect.bisect_right(self._starts, end) - 1
        if i >= 0 and ends[i] >= start:
            return False
        self._fill(start, end)
        return True

    def merge(self, intervals: Iterable[Sequence[int]]) -> None:
        """Add every seq of the given closed intervals."""
        for start, end in intervals:
            self._fill(start, end)

    def _fill(self, start: int, end: int) -> None:
        # Merge [start, end] wholesale (used when loading durable state).
        i = bisect.bisect_left(self._starts, start)
        j = i
        while j < len(self._starts) and self._starts[j] <= end + 1:
            end = max(end, self._ends[j])
            j += 1
        if i > 0 and self._ends[i - 1] + 1 >= start:
            i -= 1
            start = self._starts[i]
            end = max(end, self._ends[i])
        self._starts[i:j] = [start]
        self._ends[i:j] = [end]

    def intervals(self) -> list[Interval]:
        """The seen seqs as sorted disjoint ``(start, end)`` pairs."""
        return list(zip(self._starts, self._ends, strict=True))

    def missing(self) -> int:
        """How many seqs below the highest seen have not been seen (0 = no gap)."""
        if not self._starts:
            return 0
        held = sum(e - s + 1 for s, e in zip(self._starts, self._ends, strict=True))
        return self._ends[-1] + 1 - held


class Deduper:
    """SeqSets for every producer a sink has seen."""

    def __init__(self) -> None:
        self.sets: dict[str, SeqSet] = {}
        self.duplicates = 0

    def load(self, producer_id: str, intervals: Iterable[Interval]) -> None:
        """Merge durable state (what the sink's output already holds)."""
        existing = self.sets.get(producer_id)
        merged = (existing.intervals() if existing else []) + list(intervals)
        self.sets[producer_id] = SeqSet(merged)

    def is_new(self, producer_id: str, seq: int) -> bool:
        """True the first time (producer_id, seq) is seen."""
        seqs = self.sets.get(producer_id)
        if seqs is None:
            seqs = self.sets[producer_id] = SeqSet()
        if seqs.add(seq):
            return True
        self.duplicates += 1
        return False

    def add_range(self, producer_id: str, start: int, end: int) -> bool:
        """True if no seq of ``[start, end]`` was seen (and now all are); False changes nothing."""
        seqs = self.sets.get(producer_id)
        if seqs is None:
            seqs = self.sets[producer_id] = SeqSet()
        return seqs.add_range(start, end)

    def add_run(self, producer_id: str, seqs: list[int]) -> bool:
        """True if ``seqs`` are one run of consecutive seqs, none seen (and now all are).

        The check of a usual record, one producer's batch; False changes nothing (the caller
        goes seq by seq with :meth:`is_new`).
        """
        if not seqs or seqs != list(range(seqs[0], seqs[0] + len(seqs))):
            return False
        return self.add_range(producer_id, seqs[0], seqs[-1])

    def gaps(self) -> dict[str, int]:
        """Producers with seqs missing below their highest seen seq, and how many."""
        return {p: n for p, s in self.sets.items() if (n := s.missing())}


#: records whose digests a consumer keeps (the most recent; ~320 bytes each, 2.6 MB in all)
DIGESTS_KEPT = 8_192


def record_span(events: Sequence[Any], columns: Any) -> tuple[str, int, int, int] | None:
    """A decoded EventBatch record's (producer_id, first seq, last seq, count); None if mixed.

    ``events`` and ``columns`` as :func:`schemas.decode_record` gives them.
    """
    producers = {e.producer_id for e in events}
    seqs = [e.seq for e in events]
    if columns is not None:
        producers.add(columns.producer_id)
        seqs += columns.seqs
    if len(producers) != 1 or not seqs:
        return None
    return next(iter(producers)), min(seqs), max(seqs), len(seqs)


class RecordDigests:
    """The digests of the records a consumer took, by their span of one producer's seqs.

    A producer encodes a record once and sends those bytes again on any retry (its spool
    keeps them), so a true repeat of a record, resent or read again, has the same bytes. A
    record with the span of one taken before but other bytes is no repeat: :meth:`check`
    raises :class:`ForgedRepeatError` for it, before anything of it is taken, so the consumer
    dead-letters it and what it took first stays. Kept for the last :data:`DIGESTS_KEPT`
    records (a consumer's memory, not its checkpoint): an older or a partly overlapping
    repeat is dropped by the seqs alone, as a duplicate.
    """

    def __init__(self, kept: int = DIGESTS_KEPT) -> None:
        self.kept = kept
        self._digests: OrderedDict[tuple[str, int], tuple[int, int, bytes]] = OrderedDict()
        self.forged = 0

    def check(self, value: bytes, span: tuple[str, int, int, int] | None) -> None:
        """Remember a record's digest, or raise ForgedRepeatError for a changed repeat."""
        if span is None:
            return
        producer, first, last, count = span
        digest = hashlib.blake2b(value, digest_size=16).digest()
        key = (producer, first)
        known = self._digests.get(key)
        if known is None:
            self._digests[key] = (last, count, digest)
            if len(self._digests) > self.kept:
                self._digests.popitem(last=False)
            return
        if known == (last, count, digest):
            return
        self.forged += 1
        raise ForgedRepeatError(
            f"producer {producer!r} seqs {first}-{last}: a record with these events was taken "
            "before with other content (forged or corrupted); the first one is kept"
        )
