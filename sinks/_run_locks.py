"""One process at a time writes a run of a sink's group: a lock per run.

Kafka fences a consumer's commits by the group's generation, not its writes: a member whose
write outlasts the group's rebalance timeout (wandb opening a run, a full disk) is left out of
the next generation while that write goes on, and the partitions' new owner starts on the same
runs meanwhile. So an instance takes a run's lock before it first looks at what the sink holds
of the run, and keeps it until it lets go of its runs (a rebalance, its destination
unavailable, a stop) or forgets the run (idle): a new owner that finds the lock taken reads the
run's records again later (``RunHeld``, an ``Unavailable``: nothing committed), once the old
owner's write is done, and then sees what that write left.

The locks are byte-range locks (``lockf``) in one file per group (``<data dir>/locks/<group>.lock``),
a run's byte at a 62-bit hash of its id: held by the process, any number of them on one
descriptor, and released by the system when the process dies. On one machine, or a shared
volume whose locks hold across machines.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

from ._protocol import RunHeld


class RunLocks:
    """The runs this process holds the lock of, in the lock file at ``path`` (one per group).

    One per process and file: a process's locks on a file all go when it closes any
    descriptor of it (POSIX).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fd: int | None = None
        self._held: dict[str, int] = {}  #: run -> its byte in the file

    def __contains__(self, run_id: str) -> bool:
        return run_id in self._held

    def take(self, run_id: str) -> None:
        """Hold ``run_id``'s lock (at once if this process holds it); RunHeld if another does."""
        if run_id in self._held:
            return
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        at = int.from_bytes(hashlib.blake2b(run_id.encode(), digest_size=8).digest(), "big") >> 2
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, at)
        except OSError:  # EACCES or EAGAIN: another process holds it
            raise RunHeld(
                f"run {run_id} is still written by another instance of the group, which has not "
                "let go of it yet"
            ) from None
        self._held[run_id] = at

    def release(self, run_ids: Iterable[str]) -> None:
        """Let go of these runs' locks (those it holds)."""
        for run_id in run_ids:
            at = self._held.pop(run_id, None)
            if at is not None and self._fd is not None:
                fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, at)

    def release_all(self) -> None:
        """Let go of every run's lock."""
        self.release(list(self._held))
