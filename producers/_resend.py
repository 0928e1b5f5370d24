"""The resend window: what the broker acknowledged, kept to send again if it lost it.

A memory-only broker's acknowledgement is not durability: the embedded broker, restarted (it
died, or ``metricbus up`` restarted it to bound its memory), comes back empty. The sender
keeps each acknowledged record here for ``retain_s`` (at most ``retain_bytes``), and the newest
that no check has confirmed yet for as long as it takes. The producer's side of the planned
restart (``metricbus/stack/_planned_restart.py`` lists every step):

- **hold**: while the broker is marked restarting, the sender sends nothing (the window
  keeps growing with what the old broker acknowledged before the mark);
- **verify**: a check (``Transport.verify``) confirms the broker still holds what it
  acknowledged (:meth:`ResendWindow.confirmed`) or finds its topic re-created
  (:meth:`ResendWindow.lost`);
- **resend**: all of the window; or, when ``up`` carried the old broker's records over, only
  what was acknowledged after the last passing check (:meth:`ResendWindow.to_resend`).
Consumers drop what arrives twice by its identity.
"""

from __future__ import annotations

import collections
import time


class ResendWindow:
    """Acknowledged records, oldest first, and which of the newest no check confirmed yet."""

    def __init__(self, retain_s: float = 60.0, retain_bytes: int = 64 * 1024 * 1024) -> None:
        self.retain_s = retain_s
        self.retain_bytes = retain_bytes
        self._records: collections.deque[tuple[float, bytes]] = collections.deque()
        self._size = 0
        #: how many of the newest records no check has confirmed yet: kept past ``retain_s`` (a
        #: planned broker restart can take longer than a check interval), and put back in the
        #: spool by a stop that could not confirm them
        self.unconfirmed = 0
        #: the broker lost what it acknowledged: the window is to be sent again before anything new
        self.due = False
        self._all = True  #: all of it, else only what was acknowledged since the last check
        self.records_resent = 0

    def add(self, records: list[bytes]) -> None:
        """Keep what the broker just acknowledged; let go of what is old enough and confirmed."""
        now = time.monotonic()
        kept = self._records
        for record in records:
            kept.append((now, record))
            self._size += len(record)
        self.unconfirmed += len(records)
        while kept and (
            (len(kept) > self.unconfirmed and now - kept[0][0] > self.retain_s)
            or self._size > self.retain_bytes
        ):
            self._size -= len(kept.popleft()[1])
        self.unconfirmed = min(self.unconfirmed, len(kept))

    def confirmed(self) -> None:
        """A check found the broker holding everything it acknowledged."""
        self.unconfirmed = 0

    def lost(self, carried_over: bool) -> None:
        """The broker's topic is not the one these records went to: send them again first.

        All of the window; or, when ``metricbus up`` carried the old broker's records over (its
        planned restart), only what was acknowledged since the last passing check: the rest is
        in the new topic already (at 3,000 events/s a whole minute is 180,000 events, which
        every consumer read again and dropped after each planned restart of a soak).
        """
        self._all = not carried_over
        self.due = bool(self._records) and (self._all or self.unconfirmed > 0)

    def to_resend(self) -> list[bytes]:
        """What to send again, oldest first; unconfirmed until a check passes after it."""
        window = [record for _, record in self._records]
        if not self._all:
            window = window[len(window) - self.unconfirmed :]
        self.unconfirmed = len(window)
        return window

    def resent(self, records: int) -> bool:
        """The window was acknowledged again; True when it was all of it (the broker lost it all)."""
        self.records_resent += records
        self.due = False
        return self._all

    def unconfirmed_records(self) -> list[bytes]:
        """The newest records no check confirmed (for the spool, when the run stops before one)."""
        if not self.unconfirmed:
            return []
        return [record for _, record in list(self._records)[-self.unconfirmed :]]
