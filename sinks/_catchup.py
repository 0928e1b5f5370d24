"""What a sink group catches up on from the archive after a planned broker restart left it behind.

`metricbus up` bounds the embedded broker's memory by restarting it, carrying over what the
consumer groups have not read yet. A sink group that is far behind (a W&B sink slower than the
training jobs) or gone (stopped, crash-looping) would make that carry as large as its backlog,
or lose its backlog once it is gone past one restart. Such a group is left behind instead when
the archive sink already holds its backlog durably (its commits are past it): `up` records the
runs of the records the group had not read in ``<data>/catchup/<group>.json``, and the sink
reads them from the archive before it joins its group again (:class:`CatchUp`, which the
sink runner holds: :meth:`SinkRunner._before_join`).
Its identities drop what it already holds, so a run written in part is completed, not
written twice. Runs whose last derived record (``closes_run``) was in the backlog are marked
closed: the sink is told so once it has them (``derived_complete``).

The file is written by `up` while the group's consumers are stopped, and rewritten by the one
instance that holds ``<group>.lock`` as it finishes each run, so a sink stopped midway goes on
where it was; the other instances of the group wait for it.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO

from metricbus.schemas import (
    Codec,
    Event,
    Interval,
    MetricbusError,
    SeqSet,
    Settings,
    atomic_write,
    check_run_id,
    path_segment,
)

log = logging.getLogger("metricbus.sink")

#: Archived rows read at a time while catching up
CHUNK_ROWS = 20_000


def catchup_path(settings: Settings, group: str) -> Path:
    """The group's catch-up file (inside the data directory whatever the group is called)."""
    return Path(settings.data_dir) / "catchup" / f"{path_segment(group)}.json"


def pending_runs(settings: Settings, group: str) -> dict[str, bool]:
    """Runs ``group`` still has to catch up on, each with whether its last derived record was missed."""
    try:
        raw = json.loads(catchup_path(settings, group).read_text())
        runs = raw["runs"]
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError):
        return {}  # a torn or foreign file: atomic writes make neither; nothing to catch up on
    if not isinstance(runs, dict):
        return {}
    return {run: bool(closed) for run, closed in runs.items() if _usable(run)}


def _usable(run: object) -> bool:
    """A run id the archive can hold (the file may have been edited: it names directories)."""
    try:
        check_run_id(run)  # type: ignore[arg-type]
    except MetricbusError:
        return False
    return True


def pending_groups(settings: Settings) -> set[str]:
    """The groups with runs still to catch up on."""
    out = set()
    for path in (Path(settings.data_dir) / "catchup").glob("*.json"):
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(raw, dict) and isinstance(raw.get("group"), str) and raw.get("runs"):
            out.add(raw["group"])
    return out


def add_runs(settings: Settings, group: str, runs: Mapping[str, bool]) -> None:
    """Add ``runs`` (run id -> closed) to what ``group`` has to catch up on (`up`, consumers stopped)."""
    if not runs:
        return
    held = pending_runs(settings, group)
    for run, closed in runs.items():
        held[run] = held.get(run, False) or closed
    _write(settings, group, held)


def done(settings: Settings, group: str, run: str) -> None:
    """``run`` is caught up on (and flushed): drop it; the file goes with the last run."""
    held = pending_runs(settings, group)
    held.pop(run, None)
    _write(settings, group, held)


def _write(settings: Settings, group: str, runs: Mapping[str, bool]) -> None:
    path = catchup_path(settings, group)
    if runs:
        atomic_write(path, json.dumps({"group": group, "runs": dict(runs)}, sort_keys=True).encode())
    else:
        path.unlink(missing_ok=True)


class CatchupLock:
    """The lock one instance of a group holds while it catches up (released when its process dies)."""

    def __init__(self, settings: Settings, group: str) -> None:
        self.path = catchup_path(settings, group).with_suffix(".lock")
        self._file: IO[bytes] | None = None

    def acquire(self) -> bool:
        """Take the lock if no other instance holds it (never blocks)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = open(self.path, "ab")  # noqa: SIM115 - held open for as long as the lock
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            return False
        self._file = f
        return True

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None


class CatchUp:
    """One sink group's catch-up from the archive: its list of runs, its lock, its reading.

    The sink runner asks :meth:`runs`; one instance of the group takes the lock
    (:meth:`take_turn`, the others wait), reads each run from the first seq it does not hold
    (:meth:`chunks`), writes and flushes it as it would live, and strikes it off (:meth:`done`).
    """

    def __init__(self, settings: Settings, group: str, name: str) -> None:
        self.settings = settings
        self.group = group
        self.name = name  #: the sink's, for its log lines
        self._lock = CatchupLock(settings, group)

    def runs(self) -> dict[str, bool]:
        """Runs still to catch up on (run id -> its last derived record was missed)."""
        return pending_runs(self.settings, self.group)

    async def take_turn(self, stopping: asyncio.Event) -> bool:
        """Wait for the lock (another instance may be catching up); False when stopped first."""
        while not self._lock.acquire():
            if stopping.is_set():
                return False
            await asyncio.sleep(0.5)  # another instance catches up; its lock goes with its process
        return True

    def release(self) -> None:
        self._lock.release()

    def chunks(
        self, run_id: str, held: Mapping[str, Sequence[Interval]], codec: Codec
    ) -> Iterator[list[Event]]:
        """The archived events of ``run_id`` from, per producer, the first seq not ``held``.

        An archive that cannot be read ends the run's chunks, said in the log (a sink is not
        stopped by it: `metricbus replay` the run once the archive is mended).
        """
        from ._archive import iter_events

        since = {producer: _first_missing(intervals) for producer, intervals in held.items()}
        chunks = iter_events(
            self.settings.archive_dir, run_id, codec, derived=True, rows=CHUNK_ROWS, since=since
        )
        while True:
            try:
                events = next(chunks, None)
            except Exception as exc:  # noqa: BLE001 - an unreadable archive must not stop the sink
                log.error(
                    "%s: run %r cannot be read from the archive (%.300s): not caught up on "
                    "(`metricbus replay` it once the archive is mended)",
                    self.name,
                    run_id,
                    exc,
                )
                return
            if events is None:
                return
            yield events

    def done(self, run_id: str) -> None:
        """``run_id`` is caught up on and flushed."""
        done(self.settings, self.group, run_id)


def _first_missing(intervals: Sequence[Interval]) -> int:
    """The lowest seq not in ``intervals`` (inclusive ``(start, end)`` pairs), from 0."""
    merged = SeqSet(list(intervals)).intervals()
    return merged[0][1] + 1 if merged and merged[0][0] <= 0 else 0
