"""What goes to the dead-letter topic: the record (or a pointer to it) and why, in headers.

The one home of the dead-letter format, for every consumer (sinks, the stream worker, alert
deliverers). Headers: ``metricbus.reason`` (what was wrong), ``metricbus.source``
(``topic/partition/offset`` of the original record), ``metricbus.consumer`` (the group that
gave up on it) and, when the value is a pointer rather than the record, ``metricbus.pointer``
(the original size in bytes).
"""

from __future__ import annotations

import json
from typing import NamedTuple

#: A record larger than this is dead-lettered as a small pointer to where it still is.
MAX_DEADLETTER_VALUE = 512 * 1024
REASON_BYTES = 2000


class DeadLetter(NamedTuple):
    """One dead-letter record, ready to send."""

    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]


def dead_letter(
    value: bytes | None,
    key: bytes | None,
    reason: str,
    *,
    topic: str,
    partition: int,
    offset: int,
    consumer: str,
) -> DeadLetter:
    """The dead-letter record for a record ``consumer`` could not take, and why."""
    value = value or b""
    reason = reason if len(reason) <= REASON_BYTES else reason[: REASON_BYTES - 3] + "..."
    headers = [
        ("metricbus.reason", reason.encode("utf-8", "replace")),
        ("metricbus.source", f"{topic}/{partition}/{offset}".encode()),
        ("metricbus.consumer", consumer.encode("utf-8", "replace")),
    ]
    if len(value) > MAX_DEADLETTER_VALUE:
        headers.append(("metricbus.pointer", str(len(value)).encode()))
        pointer = {
            "topic": topic,
            "partition": partition,
            "offset": offset,
            "size": len(value),
            "reason": reason,
        }
        value = json.dumps(pointer).encode()
    if key is not None and len(key) > 1024:
        key = key[:1024]
    return DeadLetter(key, value, headers)
