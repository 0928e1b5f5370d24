"""The RunStarted of a run whose start is older than the records ``status`` reads.

``status`` reads only the last records of each partition (``STATUS_TAIL``): a long run's
RunStarted, which carries its project, name and world size, is further back. A run's records
are in one partition (the key is its run id) in the order its producers sent them, and each
producer sends its RunStarted before anything else, so the run's first record holds one. It is
found by bisecting the offsets before the first record read, the partition's start probed
first (where a run alone in its partition began): a probe reads up to
``PROBE_RECORDS`` records from an offset, looking at keys only, to the run's first record
there. A record of the run with a RunStarted ends the search; one without says the start is
further back; a probe with no record of the run says it is further on. A run that sent nothing
while its partition took ``PROBE_RECORDS`` records of others may be missed (its project then
shows as ``-``, as does one whose start the broker no longer keeps).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from metricbus.schemas import (
    ONE_SHOT_POLL_MS,
    RUN_STARTED,
    MetricbusError,
    SchemaError,
    decode_record,
)

#: records a probe reads before it says the run sent nothing there
PROBE_RECORDS = 200


def find_starts(
    consumer: Any,
    wanted: dict[bytes, tuple[Any, int]],
    signer: Any,
    codec: Any,
    until: float,
    probe_records: int = PROBE_RECORDS,
) -> list[Any]:
    """The RunStarted events of the runs in ``wanted``, those that are found.

    ``wanted``: run id (the record key) -> (its events partition, the offset of its first
    record read); ``consumer``: a kafka-python consumer, reassigned here; ``signer``,
    ``codec``: the reader's, to check and decode a record; ``until``: a ``time.monotonic()``
    past which the runs not yet found are left unfound; ``probe_records``: how many records a
    probe reads.
    """
    found: list[Any] = []
    if not wanted:
        return found
    starts_in = functools.partial(_starts_in, signer=signer, codec=codec)
    partitions = sorted({tp for tp, _ in wanted.values()})
    begins = consumer.beginning_offsets(partitions)  # one request for them all
    for key, (tp, offset) in wanted.items():
        if time.monotonic() > until:
            break
        consumer.assign([tp])
        found += _bisect(consumer, tp, key, (begins[tp], offset), probe_records, starts_in, until)
    return found


def _bisect(
    consumer: Any,
    tp: Any,
    key: bytes,
    offsets: tuple[int, int],
    probe_records: int,
    starts_in: Callable[[bytes | None], list[Any]],
    until: float,
) -> list[Any]:
    """The RunStarted events of the run keyed ``key`` in ``offsets`` [lo, hi) of ``tp``; [] if not found."""
    lo, hi = offsets
    probe = lo  # first at the partition's start: where a run alone in it (a local stack) began
    while lo < hi and time.monotonic() < until:
        # a whole window even past ``hi``: that nothing of the run is in it says it started
        # after only if it is as long as a running run's quietest stretch
        end = probe + probe_records
        record = _first_of(consumer, tp, key, probe, end, until)
        if record is None:
            lo = end  # nothing of the run there: it started after
            probe = (lo + hi) // 2
            continue
        starts = [e for e in starts_in(record.value) if e.run_id.encode() == key]
        if starts:
            return starts
        hi = probe  # the run was going at the probe: it started before
        probe = (lo + hi) // 2
    return []


def _first_of(consumer: Any, tp: Any, key: bytes, start: int, end: int, until: float) -> Any:
    """The first record keyed ``key`` in [start, end) of ``tp``; None if there is none."""
    consumer.seek(tp, start)
    while time.monotonic() < until:
        for record in consumer.poll(timeout_ms=ONE_SHOT_POLL_MS).get(tp, []):
            if record.offset >= end:
                return None
            if record.key == key:
                return record
        position, high = consumer.position(tp), consumer.highwater(tp)
        if position >= end or (high is not None and position >= high):
            return None
    return None


def _starts_in(value: bytes | None, signer: Any, codec: Any) -> list[Any]:
    """The RunStarted events of a record of the events topic (none from one that does not read)."""
    if value is None:
        return []
    try:
        signer.check(value)
        events, _ = decode_record(codec, value)  # a RunStarted is never in the columns
        return [e for e in events if e.kind == RUN_STARTED]
    except (SchemaError, MetricbusError, ValueError, KeyError, TypeError):
        return []
