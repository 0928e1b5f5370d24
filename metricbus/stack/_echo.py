"""Alert transitions on ``metricbus up``'s own terminal, each with its run's name.

The console alert consumer writes one line per alert (``[FIRING] ...`` / ``[RESOLVED] ...``)
to its log; ``up`` reads what is new there at each supervision pass and says it, with the run's
name from the archive beside its id. Reading the log keeps the consumer's exactly-once delivery
(its ledger) the one source of truth: an alert shown here is one the console consumer delivered.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from metricbus.schemas import RUN_STARTED

#: a line of the console consumer (schemas.format_alert), and the run id in it
_ALERT = re.compile(r"^\[(FIRING|RESOLVED|ENDED)\] ")
_RUN = re.compile(r": run (\S+)")
#: run names looked up, kept for the next alerts of the same runs (bounded)
NAMES_KEPT = 1024
#: the most read from the log in one pass (a consumer far behind catches up over passes)
READ_MAX = 1 << 20


class AlertEcho:
    """Say each alert line the console consumer wrote since the last :meth:`poll`."""

    def __init__(self, log_path: Path, archive: Path, say: Callable[[str], None]) -> None:
        self.log_path = log_path
        self.archive = archive
        self.say = say
        try:  # alerts of an earlier `up` in the same log were said then
            self._offset = log_path.stat().st_size
        except OSError:
            self._offset = 0
        self._partial = b""
        self._names: dict[str, str] = {}

    def poll(self) -> None:
        """Say the alert lines written since the last call (never raises for a missing log)."""
        try:
            with open(self.log_path, "rb") as f:
                size = f.seek(0, 2)
                if size < self._offset:  # the log was replaced: read it from its start
                    self._offset, self._partial = 0, b""
                f.seek(self._offset)
                data = f.read(READ_MAX)
        except OSError:
            return
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        for raw in lines:
            line = raw.decode("utf-8", "replace").rstrip("\r")
            if _ALERT.match(line):
                self.say(f"metricbus alert: {self._named(line)}")

    def _named(self, line: str) -> str:
        """The line with the run's name beside its id, when the archive knows it."""
        found = _RUN.search(line)
        if found is None:
            return line
        run_id = found.group(1)
        name = self._names.get(run_id)
        if name is None:
            name = self._lookup(run_id)
            if len(self._names) >= NAMES_KEPT:
                self._names.clear()
            self._names[run_id] = name
        if not name or name == run_id:
            return line
        return line[: found.start()] + f": run {name} ({run_id})" + line[found.end() :]

    def _lookup(self, run_id: str) -> str:
        from metricbus.sinks import iter_events

        try:
            for chunk in iter_events(self.archive, run_id, kinds={RUN_STARTED}):
                for event in chunk:
                    return str(event.body["name"])
        except (OSError, ValueError):
            pass
        return ""
