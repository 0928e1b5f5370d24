"""Files that are either whole or absent, and the seq ledger sinks keep beside their output.

The one home of atomic writes: every file metricbus replaces in place goes through
:func:`atomic_write` (temporary name, fsync, rename, fsync of the directory), so a crash
leaves the old file or the new one, never a torn one. Also the one reader of the YAML files
users hand to metricbus (:func:`read_yaml`), with the file named in every error.
"""

from __future__ import annotations

import errno
import json
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ._dedupe import Interval, SeqSet
from ._errors import ConfigError

#: Errors of writing into one directory, not of the filesystem: a file where the directory
#: should be, a directory of another user, a link loop. A sink writes that run elsewhere
#: (its fallback directory) instead of retrying for ever; a full or failing disk is retried.
DIRECTORY_ERRNOS = frozenset(
    {errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EEXIST, errno.EISDIR, errno.ELOOP}
)


def read_yaml(path: Path | str, what: str) -> Any:
    """A user's YAML file (stream config, layout, ...); ConfigError naming the file on failure."""
    import yaml

    path = Path(path)
    try:
        return yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc})") from None


def fsync_dir(directory: Path) -> None:
    """Make a rename or unlink inside ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes | Callable[[Path], None]) -> None:
    """Replace ``path`` with ``data`` (bytes, or a function that writes the temporary file).

    Durable when it returns: the file and its directory entry are fsynced.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # a name of this writer's own: two processes writing one path (the same media item) never
    # write or remove each other's temporary
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    try:
        if callable(data):
            data(tmp)
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        else:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a disk that refused it (full) keeps no torn temporary
        raise
    fsync_dir(path.parent)


class Ledger:
    """Which (producer_id, seq) an output holds, for one run: a JSON file of seq intervals.

    ``add`` in memory, ``save`` atomically once the output itself is durable, ``load`` after a
    restart (what the sink's ``recover`` reports). Derived events count under
    ``DERIVED_PRODUCER`` with their per-run seqs; a seq below 0 (no identity) is not kept.
    ``files`` records, with the seqs, how long each output file was when they were saved, so
    a sink that appends can cut what a crash left past that point (it will be re-delivered).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.seqs: dict[str, SeqSet] = {}
        self.files: dict[str, int] = {}
        self.dirty = False

    @staticmethod
    def _raw(path: Path) -> dict[str, Any]:
        try:
            raw = json.loads(Path(path).read_text())
        except FileNotFoundError:
            return {"seqs": {}, "files": {}}
        if raw.get("format") != 2:  # format 1: the seqs mapping alone
            return {"seqs": raw, "files": {}}
        return dict(raw)

    @classmethod
    def read(cls, path: Path) -> dict[str, list[Interval]]:
        """The intervals saved at ``path`` (empty when there is no file)."""
        return {str(p): [(int(a), int(b)) for a, b in iv] for p, iv in cls._raw(path)["seqs"].items()}

    def load(self) -> Ledger:
        """Merge what the file holds; returns self."""
        raw = self._raw(self.path)
        self.merge(self.read(self.path))
        self.files.update({str(k): int(v) for k, v in raw["files"].items()})
        return self

    def merge(self, held: Mapping[str, Iterable[Sequence[int]]]) -> None:
        """Add intervals (e.g. from another file of the same run)."""
        for producer, intervals in held.items():
            self.seqs.setdefault(producer, SeqSet()).merge(intervals)

    def has(self, producer_id: str, seq: int) -> bool:
        """Whether the event is held (a seq below 0, no identity, never is)."""
        seqs = self.seqs.get(producer_id)
        return seq >= 0 and seqs is not None and seq in seqs

    def add(self, producer_id: str, seq: int) -> bool:
        """Record one event as held (durable only after the next ``save``); False if it was."""
        if seq < 0:
            return True
        seqs = self.seqs.get(producer_id)
        if seqs is None:
            seqs = self.seqs[producer_id] = SeqSet()
        if not seqs.add(seq):
            return False
        self.dirty = True
        return True

    def intervals(self) -> dict[str, list[Interval]]:
        """{producer_id: intervals}, what ``recover`` reports."""
        return {p: s.intervals() for p, s in self.seqs.items()}

    def save(self) -> None:
        """Write the ledger atomically if anything was added since the last save."""
        if self.dirty:
            record = {"format": 2, "seqs": self.intervals(), "files": self.files}
            atomic_write(self.path, json.dumps(record).encode())
            self.dirty = False

    def save_shared(self) -> None:
        """``save`` to a file other processes save to too (the instances of one consumer group).

        Under an exclusive lock on ``<file>.lock``, what the file holds now is merged in first,
        so no instance's save drops what another saved; ``load`` then also sees what the others
        took.
        """
        import fcntl

        if not self.dirty:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "ab") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # released when the file closes
            self.load()
            self.save()
