"""The contract every sink implements: :class:`Sink` (one module per sink; no sink imports another).

Guarantee the runtime gives a sink: ``write`` sees each event identity at most once per
process (``(producer_id, seq)`` for logged events; ``(run_id, seq)`` under producer
``DERIVED_PRODUCER`` for derived ones), in partition order, and offsets are committed only
after ``flush`` returned. So a sink must make everything written so far durable before
``flush`` returns, and report in ``recover`` what it already holds durably, derived seqs
included, so that events re-delivered after a crash are recognised as duplicates.

A sink never raises from ``write`` for an event its output cannot take: it writes what it
can of it (e.g. a histogram of the finite samples) and returns the rest with the reason; the
runtime dead-letters those and goes on.
"""

from __future__ import annotations

import abc
import fnmatch
from collections.abc import Mapping, Sequence
from typing import ClassVar

from metricbus.schemas import Event, Interval, ScalarColumns

#: metric names whose include/exclude verdict a filter caches (names come from users and topics)
NAMES_KEPT = 65_536


class MetricFilter:
    """Which metric names a sink writes: those matching an ``include`` glob and no ``exclude`` glob.

    Verdicts are cached, the cache bounded (:data:`NAMES_KEPT`). Not thread-safe (a sink's own).
    """

    def __init__(self, include: Sequence[str] = ("*",), exclude: Sequence[str] = ()) -> None:
        self.include = tuple(include) or ("*",)
        self.exclude = tuple(exclude)
        #: True when every name passes: callers skip the check
        self.everything = self.include == ("*",) and not self.exclude
        self._verdicts: dict[str, bool] = {}

    def __call__(self, name: str) -> bool:
        """Whether the sink writes the metric ``name``."""
        if self.everything:
            return True
        keep = self._verdicts.get(name)
        if keep is None:
            if len(self._verdicts) >= NAMES_KEPT:
                self._verdicts.clear()
            keep = self._verdicts[name] = any(fnmatch.fnmatchcase(name, g) for g in self.include) and not any(
                fnmatch.fnmatchcase(name, g) for g in self.exclude
            )
        return keep


class Unavailable(Exception):  # noqa: N818 - the destination's state, not a bad record
    """Raised by a sink's ``write`` when its destination cannot take anything now.

    Not the events' fault, so none is dead-lettered: the runtime commits what is durable, reads
    everything after it again from its partitions, and waits (backoff) before going on.
    """


class RunHeld(Unavailable):
    """Another instance of the group still holds a run this one was given (``_run_locks``).

    A handover under way, not a destination failing: read again after the same backoff, but
    neither counted as unavailable nor shown as failing.
    """


class Sink(abc.ABC):
    """open -> (write* flush)* -> close; the optional members have working no-op defaults."""

    #: Short name; the consumer group is ``<topic prefix>sink.<name>``.
    name: ClassVar[str]
    #: True when :meth:`write_columns` takes a record's columns (the runtime's fast path).
    columnar: ClassVar[bool] = False

    @abc.abstractmethod
    def open(self) -> None:
        """Prepare output (directories, clients); clean up leftovers of a crash."""

    @abc.abstractmethod
    def recover(self, run_id: str) -> Mapping[str, Sequence[Interval]]:
        """Seqs this sink already holds durably for ``run_id``: {producer_id: intervals}."""

    @abc.abstractmethod
    def write(self, events: Sequence[Event]) -> Sequence[tuple[Event, str]] | None:
        """Buffer events (already decoded and deduplicated); return those it cannot take, and why."""

    @abc.abstractmethod
    def pending(self) -> int:
        """Events buffered since the last flush."""

    @abc.abstractmethod
    def flush(self) -> None:
        """Make every buffered event durable; raise to signal failure (nothing is committed)."""

    def close(self) -> None:  # noqa: B027 - optional: a sink with nothing to release keeps it
        """Release resources; called after a final flush."""

    def derived_complete(self, run_id: str) -> None:  # noqa: B027 - optional, a no-op by default
        """The stream worker has published every derived event of ``run_id`` (after its RunFinished)."""

    def release(self) -> None:  # noqa: B027 - optional, a no-op by default
        """Called after a flush when the consumer group moved partitions away.

        Drop per-run state held in memory (open files, ledgers, open W&B runs); the next event
        of a run reopens it from the durable output.
        """

    def confirmed(self) -> tuple[int, int] | None:
        """For a sink whose destination confirms writes late: (handed, durable), else None.

        ``handed``: how many events were passed to :meth:`write` so far, every event of every
        call counted in order; ``durable``: how many of the first of them the destination is
        known to hold. The runtime commits no record past one whose events are not all durable
        yet, and flushes again while :meth:`pending` is not 0. None (the default): everything
        a flush returned from is durable.
        """
        return None

    def close_run(self, run_id: str) -> None:  # noqa: B027 - optional, a no-op by default
        """Close what is held open for ``run_id`` (it reopens on the run's next event)."""

    def write_columns(self, columns: ScalarColumns) -> None:
        """Buffer a record's scalars-only Metrics events as its columns, with no object per event.

        Called instead of :meth:`write` (only when :attr:`columnar`) when none of them was seen
        before. Takes every one or raises (then they go through ``write``, event by event).
        """
        raise NotImplementedError(f"the {self.name} sink does not take columns")
