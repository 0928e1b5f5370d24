"""Records a sink holds for runs it has not seen yet: derived records and alerts.

They come from other topics (aggregates, alerts) than the run's logged events and can overtake
them: a derived point of a run whose RunStarted the sink has not written yet has nowhere to
go. So it is held, and written once the run is known; its partition is not committed past it
meanwhile (:meth:`HeldRecords.limit`). While too many are held, the runtime stops reading
their topics (:meth:`HeldRecords.pause_or_resume`). A run whose logged events never come here
(a hostile or misrouted record, a run whose events another instance reads) is marked with
where this instance's events partitions ended (:meth:`HeldRecords.unmarked`,
:meth:`HeldRecords.mark`); once they are read past those ends, what is held for it is let go
to the dead-letter topic (:meth:`HeldRecords.unseen`, :meth:`HeldRecords.take`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: Records held for runs not seen yet past which a sink stops reading their topics until it
#: holds half as many: a sink catching up on a backlog reads the small aggregates topic far
#: ahead of the events that bring its runs' RunStarted.
MAX_HELD_RECORDS = 10_000


class HeldRecords:
    """Per run not seen yet, its held derived records and alerts (``(record, item)`` pairs)."""

    def __init__(self) -> None:
        self.derived: dict[str, list[tuple[Any, Any]]] = {}
        self.alerts: dict[str, list[tuple[Any, Any]]] = {}
        #: per run held, where the events partitions ended soon after it was first held
        self._marks: dict[str, dict[Any, int]] = {}
        self.paused = False  #: the aggregates and alerts partitions paused: too much held
        #: held records let out (written) since :meth:`take_released`
        self._released: list[Any] = []

    def __len__(self) -> int:
        return sum(map(len, self.derived.values())) + sum(map(len, self.alerts.values()))

    def __bool__(self) -> bool:
        return bool(self.derived or self.alerts)

    def ready(
        self,
        held: dict[str, list[tuple[Any, Any]]],
        items: list[tuple[Any, Any]],
        seen: Callable[[str], bool],
    ) -> list[tuple[Any, Any]]:
        """Of ``items`` (record, something with a ``run_id``), those of runs ``seen``.

        The ``held`` ones (:attr:`derived` or :attr:`alerts`) of such runs come first; the
        others are held.
        """
        for run_id in [r for r in held if seen(r)]:
            self._released.extend(record for record, _ in held[run_id])
            items = held.pop(run_id) + items
        ready = []
        for record, item in items:
            if seen(item.run_id):
                ready.append((record, item))
            else:
                held.setdefault(item.run_id, []).append((record, item))
        return ready

    def take_released(self) -> list[Any]:
        """The held records written since the last call (their offsets bound the next commit)."""
        released, self._released = self._released, []
        return released

    def limit(self, uncommitted: dict[Any, int]) -> None:
        """Lower ``uncommitted`` (offsets to commit) so that none is past a held record."""
        from aiokafka import TopicPartition

        for held in [*self.derived.values(), *self.alerts.values()]:
            for record, _ in held:
                tp = TopicPartition(record.topic, record.partition)
                if tp in uncommitted:
                    uncommitted[tp] = min(uncommitted[tp], record.offset)

    def pause_or_resume(self) -> str | None:
        """'pause' once MAX_HELD_RECORDS are held, 'resume' at half as many, else None."""
        held = len(self)
        if not self.paused and held >= MAX_HELD_RECORDS:
            self.paused = True
            return "pause"
        if self.paused and held <= MAX_HELD_RECORDS // 2:
            self.paused = False
            return "resume"
        return None

    def unmarked(self) -> set[str]:
        """The runs held and not marked yet (marks of runs no longer held are dropped)."""
        runs = set(self.derived) | set(self.alerts)
        self._marks = {run: ends for run, ends in self._marks.items() if run in runs}
        return runs - set(self._marks)

    def mark(self, runs: set[str], ends: dict[Any, int]) -> None:
        self._marks.update(dict.fromkeys(runs, ends))

    def unseen(self, positions: dict[Any, int]) -> list[str]:
        """The marked runs whose events partitions were read past their marks (unmarked now)."""
        runs = [
            run
            for run, ends in self._marks.items()
            if all(positions[tp] >= end for tp, end in ends.items() if tp in positions)
        ]
        for run in runs:
            del self._marks[run]
        return runs

    def take(self, run: str) -> list[tuple[Any, Any]]:
        """Everything held for ``run``, no longer held."""
        return self.derived.pop(run, []) + self.alerts.pop(run, [])

    def clear(self) -> None:
        """Drop everything (the partitions were revoked: not committed past, delivered again)."""
        self.derived.clear()
        self.alerts.clear()
        self._marks.clear()
        self._released.clear()
        self.paused = False  # a new assignment starts unpaused
