"""Alert transitions on ``metricbus up``'s own terminal, each with its run's name.

The console alert consumer writes one line per alert (``[FIRING] ...`` / ``[RESOLVED] ...``)
to its log; ``up`` reads what is new there at each supervision pass and says it, with the run's
name from the archive beside its id. Reading the log keeps the consumer's exactly-once delivery
(its ledger) the one source of truth: an alert shown here is one the console consumer delivered.
The archive can be behind the alert (the Parquet sink writes at its flush interval): a line
whose run the archive does not know yet waits up to NAME_WAIT_S for it, the lines after it
behind it, then is said with the id alone.
"""

from __future__ import annotations

import collections
import re
import time
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
#: seconds an alert line waits for the archive to know its run's name (the Parquet sink's
#: flush interval is 2 s)
NAME_WAIT_S = 5.0


class AlertEcho:
    """Say each alert line the console consumer wrote since the last :meth:`poll`."""

    def __init__(
        self,
        log_path: Path,
        archive: Path,
        say: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log_path = log_path
        self.archive = archive
        self.say = say
        self._clock = clock
        self._waiting: collections.deque[tuple[float, str]] = collections.deque()  # (read at, line)
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
            data = b""
        now = self._clock()
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        for raw in lines:
            line = raw.decode("utf-8", "replace").rstrip("\r")
            if _ALERT.match(line):
                self._waiting.append((now, line))
        while self._waiting:
            read_at, line = self._waiting[0]
            named = self._named(line)
            if named is None and now - read_at < NAME_WAIT_S:
                return  # its run's name may reach the archive yet; the lines after it wait too
            self._waiting.popleft()
            self.say(f"metricbus alert: {named or line}")

    def _named(self, line: str) -> str | None:
        """The line with the run's name beside its id (None while the archive lacks the run).

        The line itself when it names no run, or the run has no name but its id.
        """
        found = _RUN.search(line)
        if found is None:
            return line
        run_id = found.group(1)
        name = self._names.get(run_id)
        if name is None:
            name = self._lookup(run_id)
            if not name:
                return None  # not kept: asked again at the next pass
            if len(self._names) >= NAMES_KEPT:
                self._names.clear()
            self._names[run_id] = name
        if name == run_id:
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
