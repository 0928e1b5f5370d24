"""One process at a time writes a run of a sink's group: a lock file per run.

Kafka fences a consumer's commits by the group's generation, not its writes: a member whose
write outlasts the group's rebalance timeout (wandb opening a run, a full disk) is left out of
the next generation while that write goes on, and the partitions' new owner starts on the same
runs meanwhile. So an instance takes a run's lock (``<data dir>/locks/<group>/<run>.lock``,
``flock``) before it first looks at what the sink holds of the run, and keeps it until it lets
go of its runs (a rebalance, its destination unavailable, a stop) or forgets the run (idle):
a new owner that finds the lock taken reads the run's records again later (``Unavailable``:
nothing committed), once the old owner's write is done, and then sees what that write left.
On one machine, or a shared volume whose locks hold across machines.
"""

from __future__ import annotations

import fcntl
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import IO

from metricbus.schemas import path_segment

from ._protocol import Unavailable

log = logging.getLogger("metricbus.sink")


class RunLocks:
    """The runs this process holds the lock of, under ``root`` (one folder per consumer group)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._held: dict[str, IO[bytes]] = {}

    def take(self, run_id: str) -> None:
        """Hold ``run_id``'s lock (at once if this process holds it); Unavailable if another does."""
        if run_id in self._held:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        f = open(self.root / f"{path_segment(run_id)}.lock", "ab")  # noqa: SIM115 - held open with the lock
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            raise Unavailable(
                f"run {run_id} is still written by another instance of the group, which has not "
                "let go of it yet"
            ) from None
        self._held[run_id] = f

    def release(self, run_ids: Iterable[str]) -> None:
        """Let go of these runs' locks (those it holds)."""
        for run_id in run_ids:
            f = self._held.pop(run_id, None)
            if f is not None:
                f.close()  # closing the file releases its flock

    def release_all(self) -> None:
        """Let go of every run's lock."""
        self.release(list(self._held))
