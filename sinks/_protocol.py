"""The contract every sink implements (one module per sink; no sink imports another).

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

from collections.abc import Mapping, Sequence
from typing import Protocol

from metricbus.schemas import Event, Interval


class Sink(Protocol):
    """open -> (write* flush)* -> close."""

    #: Short name; the consumer group is ``<topic prefix>sink.<name>``.
    name: str

    def open(self) -> None:
        """Prepare output (directories, clients); clean up leftovers of a crash."""

    def recover(self, run_id: str) -> Mapping[str, Sequence[Interval]]:
        """Seqs this sink already holds durably for ``run_id``: {producer_id: intervals}."""

    def write(self, events: Sequence[Event]) -> Sequence[tuple[Event, str]] | None:
        """Buffer events (already decoded and deduplicated); return those it cannot take, and why."""

    def derived_complete(self, run_id: str) -> None:
        """The stream worker has published every derived event of ``run_id`` (after its RunFinished)."""

    def pending(self) -> int:
        """Events buffered since the last flush."""

    def flush(self) -> None:
        """Make every buffered event durable; raise to signal failure (nothing is committed)."""

    def close(self) -> None:
        """Release resources; called after a final flush."""

    # Optional: ``write_columns(columns: ScalarColumns)`` — buffer a record's scalars-only
    # Metrics events as its columns (``schemas.decode_record``), with no object per event; the
    # runtime calls it instead of ``write`` when none of them was seen before. It takes every
    # one or raises (then they go through ``write``, event by event).
    #
    # Optional: ``release()`` — called after a flush when the consumer group moved partitions
    # away: drop per-run state held in memory (open files, ledgers, open W&B runs); the next
    # event of a run reopens it from the durable output.
