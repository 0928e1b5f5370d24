"""How the commands log: a Kafka client's repeats counted, every line made terminal-safe."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from metricbus.schemas import printable


class Repeats(logging.Filter):
    """A Kafka client's line said again within ``every_s`` is counted, not printed.

    With the broker down (or restarting under ``metricbus up``) kafka-python logged two ERROR
    lines a second in every process that waits for it (the dashboard: 29 in 20 s). The first
    is printed; the next one after ``every_s`` says how many were held back.
    """

    def __init__(self, every_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.every_s, self.clock = every_s, clock
        self._said: dict[tuple[str, str], tuple[float, int]] = {}  # (logger, template): (when, held)
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(("kafka", "aiokafka")):
            return True
        key, now = (record.name, str(record.msg)), self.clock()
        with self._lock:
            when, held = self._said.get(key, (None, 0))
            if when is not None and now - when < self.every_s:
                self._said[key] = (when, held + 1)
                return False
            self._said[key] = (now, 0)
        if held:
            record.msg, record.args = f"{record.getMessage()} (and {held} more like it held back)", None
        return True


class Printable(logging.Formatter):
    """Log lines with every non-printable character of the message escaped (:func:`printable`).

    Messages quote names from topics; a newline or an ANSI escape in one would forge or hide a
    line of the terminal `metricbus up` writes to. Tracebacks keep their lines (each escaped).
    """

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        return printable(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:  # noqa: N802 - logging's name
        return "\n".join(map(printable, super().formatException(ei).split("\n")))
