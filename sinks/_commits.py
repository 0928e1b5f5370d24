"""What one consumer commits, one commit at a time, and its alive stamps.

Every commit carries this moment as each offset's metadata (``schemas.alive_stamp``); every
:data:`ALIVE_EVERY_S` the consumer also says it runs on the alive topic (keyed by its group),
also while a slow destination holds its writes, and so its commits, up. ``metricbus status``
reads both to tell a group that consumes slowly from one that stopped (the embedded broker
keeps no commit metadata: the topic alone tells there, as it does on any broker).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from metricbus.schemas import Settings, alive_stamp

log = logging.getLogger("metricbus.sink")

#: How often a consumer says it is alive, reading or not
ALIVE_EVERY_S = 5.0


class Commits:
    """The commits of one consumer of ``group_id``; its clients are set once they start."""

    def __init__(self, settings: Settings, group_id: str, name: str) -> None:
        self.settings, self.group_id, self.name = settings, group_id, name
        self.consumer: Any = None
        self.producer: Any = None
        #: per partition it holds: what this process last committed, or found committed when
        #: the partition was assigned to it
        self.held: dict[Any, int] = {}
        self._lock = asyncio.Lock()  #: one commit at a time

    def changed(self, offsets: dict[Any, int]) -> dict[Any, int]:
        """Those of ``offsets`` not committed already."""
        return {tp: o for tp, o in offsets.items() if self.held.get(tp) != o}

    async def commit(self, offsets: dict[Any, int]) -> None:
        """Commit ``offsets``, each with this moment as its metadata."""
        from aiokafka.structs import OffsetAndMetadata

        async with self._lock:  # a flush's and a new assignment's: stamps never go backwards
            stamp = alive_stamp()
            await self.consumer.commit({tp: OffsetAndMetadata(o, stamp) for tp, o in offsets.items()})
            self.held.update(offsets)

    async def assigned(self, assigned: Any) -> None:
        """Partitions came: commit the log start of each this group has no commit on; note the others'.

        Where the group reads from anyway (earliest). Until then the group was invisible to
        `metricbus up`'s planned broker restart, which carries over what each group still needs
        by its commits: a sink stopped before its first commit would lose what it had not read.
        What the group committed on the others is noted: not committed again unchanged.
        """
        try:
            found = {tp: await self.consumer.committed(tp) for tp in assigned}
            self.held.update({tp: o for tp, o in found.items() if o is not None})
            fresh = [tp for tp, o in found.items() if o is None]
            if fresh:
                starts = await self.consumer.beginning_offsets(fresh)
                await self.commit({tp: starts[tp] for tp in fresh})
        except Exception as exc:  # noqa: BLE001 - reading goes on; the next flush commits
            log.warning("%s: cannot commit where its new partitions start (%s)", self.name, exc)

    async def rewind(self) -> None:
        """Read every partition it holds again from what the group committed on it.

        From offset 0 too, and from the log start where nothing is committed: aiokafka's
        ``seek_to_committed`` leaves a partition whose commit is 0 where it is, so records read
        there and not taken (a destination unavailable) were skipped for good.
        """
        from aiokafka.errors import IllegalStateError

        for tp in self.consumer.assignment():
            try:
                committed = await self.consumer.committed(tp)
                if committed is None:
                    await self.consumer.seek_to_beginning(tp)
                else:
                    self.consumer.seek(tp, committed)
            except IllegalStateError:  # revoked meanwhile: its new owner reads it from the commit
                continue

    def revoked(self) -> None:
        """Partitions were taken away: another member may commit them next."""
        self.held.clear()

    async def say_alive(self) -> None:
        """Every ALIVE_EVERY_S until cancelled: a stamp on the alive topic."""
        topic, key = self.settings.topics.alive, self.group_id.encode()
        while True:
            try:
                await self.producer.send(topic, alive_stamp().encode(), key=key)
            except Exception as exc:  # noqa: BLE001 - a missed beat: status sees it older, no more
                log.debug("%s: alive stamp not sent (%s)", self.name, exc)
            await asyncio.sleep(ALIVE_EVERY_S)
