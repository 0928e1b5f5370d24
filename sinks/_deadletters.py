"""A consumer's dead letters: what it could not take, sent with the reason, never dropped."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from metricbus.schemas import Settings, dead_letter

log = logging.getLogger("metricbus.sink")


class DeadLetters:
    """Sends one consumer's dead letters; its producer is set once the consumer's clients start.

    ``counted``: the object whose ``deadlettered`` counts them (the consumer's stats);
    ``stopping``: set when the consumer stops (a send that fails then is not retried: nothing
    past the record is committed, so the next process meets it again).
    """

    def __init__(
        self, settings: Settings, group_id: str, name: str, stopping: asyncio.Event, counted: Any
    ) -> None:
        self.settings, self.group_id, self.name = settings, group_id, name
        self.producer: Any = None
        self._stopping = stopping
        self._counted = counted

    async def send(self, value: bytes | None, key: bytes | None, reason: str, record: Any) -> None:
        """Send what could not be taken to the dead-letter topic, with the reason.

        Retried (0.5 s doubling to 30 s) until the broker takes it: the consumer never commits
        past a record it did not keep.
        """
        self._counted.deadlettered += 1
        topic, partition, offset = (
            (record.topic, record.partition, record.offset) if record else ("-", -1, -1)
        )
        where = f"{topic}[{partition}]@{offset}" if record else "an event"
        log.error(
            "%s: %s cannot be taken (%.300s); sent to %s",
            self.name,
            where,
            reason,
            self.settings.topics.deadletter,
        )
        letter = dead_letter(
            value, key, reason, topic=topic, partition=partition, offset=offset, consumer=self.group_id
        )
        backoff = 0.5
        while True:
            try:
                await self.producer.send_and_wait(
                    self.settings.topics.deadletter,
                    value=letter.value,
                    key=letter.key,
                    headers=letter.headers,
                )
                return
            except Exception as send_exc:  # noqa: BLE001 - never commit past a record we did not keep
                log.error("dead-letter send failed (%s); retrying in %.1fs", send_exc, backoff)
                if self._stopping.is_set():
                    raise
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)
