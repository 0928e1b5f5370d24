"""Test doubles shipped next to the tests: a transport we can take down and slow down."""

from __future__ import annotations

import threading
import time

from metricbus.producers import TransportError
from metricbus.schemas import decode_events, default_codec


class FakeTransport:
    def __init__(self) -> None:
        self.records: list[bytes] = []
        self.down = False
        self.delay_s = 0.0
        self.calls = 0
        self.lock = threading.Lock()

    def send(self, key: bytes, records: list[bytes]) -> None:
        self.calls += 1
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.down:
            raise TransportError("fake broker is down")
        with self.lock:
            self.records.extend(records)

    def take_lost(self) -> bool:
        return False

    unverified = False
    carried_over = False

    def verify(self) -> None:
        pass

    def close(self) -> None:
        pass

    def events(self):
        codec = default_codec()
        out = []
        for record in self.records:
            out.extend((e.producer_id, e.seq, (e.kind, e.body)) for e in decode_events(codec, record))
        return out
