"""The pipeline's state for the dashboard: consumer-group statuses, dead letters, spools.

Sampled on a thread of its own, so that a page never waits on Kafka.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from metricbus.ops._status import (
    StatusWatch,
    catching_up,
    dead_letters,
    kafka_down,
    mark_failing,
    sink_failures,
    spools,
)
from metricbus.schemas import Settings

log = logging.getLogger("metricbus.dashboard")

#: Seconds between lag samples (the window holds the last ten: 50 s) and dead-letter reads.
SAMPLE_EVERY_S = 5.0


class Pipeline:
    """Consumer-group statuses, dead letters and spools, refreshed on a thread of their own."""

    def __init__(self, settings: Settings, every_s: float = SAMPLE_EVERY_S, stop_after_s: float = 30.0):
        self.settings = settings
        self.every_s = every_s
        self.watch = StatusWatch(settings, window=10, stop_after_s=stop_after_s)
        self.latest: dict[str, Any] = {
            "groups": [],
            "dead_letters": {},
            "spools": [],
            "catching_up": [],
            "at": None,
        }
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Pipeline:
        self._thread = threading.Thread(target=self._loop, name="metricbus-pipeline", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling; the thread closes its own Kafka clients.

        Closing them from here while a sample was in flight failed that sample. (Any close
        races kafka-python's own IO thread; ``schemas._kafka`` keeps that race's harmless
        traceback out of the log.)
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10.0)
        else:
            self.watch.close()

    def refresh(self) -> None:
        groups = self.watch.sample()
        mark_failing(groups, sink_failures(self.settings))
        self.latest = {
            "groups": groups,
            "dead_letters": dead_letters(self.settings),
            "spools": spools(self.settings),
            "catching_up": catching_up(self.settings),
            "at": round(time.time(), 3),
        }
        down = kafka_down(groups)  # the page heads with it
        if down:
            self.latest["error"] = down
        self.samples += 1

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    self.refresh()
                except Exception as exc:  # noqa: BLE001 - the page says so; the next sample may work
                    log.warning("pipeline sample failed: %s", exc)
                    self.latest = {**self.latest, "error": f"{type(exc).__name__}: {exc}"}
                self._stop.wait(self.every_s)
        finally:
            self.watch.close()
