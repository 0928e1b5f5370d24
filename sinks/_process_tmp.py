"""A process's temporary directory under the data directory, removed once the process is gone.

wandb makes temporary directories in the system's temp dir when it is imported (``wandb-media``,
``wandb-artifacts``) and for its service, and removes them at a clean exit: a W&B sink killed
with SIGKILL left them in /tmp, outside the data directory. The sink's process points Python's
``tempfile`` and its children's ``TMPDIR`` (wandb-core) at a directory of its own under the
sink's root instead (``<root>/.metricbus-tmp/``), before wandb is imported: the command line
does, for the process it is (a library never changes its host process's temp dir).

Each such directory ``<base>/<name>/`` has a lock file ``<base>/<name>.lock`` that its process
holds (``flock``, released by the system when the process dies, however it dies). The next
process to take a directory under ``base`` removes every directory whose lock is free: its
process is gone. On one machine, or a shared volume whose locks hold across machines.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import weakref
from pathlib import Path

DIR_NAME = ".metricbus-tmp"
_taken: dict[Path, Path] = {}  #: base -> this process's directory under it


def _remove(lock: Path) -> None:
    shutil.rmtree(lock.with_suffix(""), ignore_errors=True)
    lock.unlink(missing_ok=True)


def sweep(base: Path) -> list[Path]:
    """Remove the directories under ``base`` whose process is gone; the ones removed."""
    removed = []
    for lock in sorted(Path(base).glob("*.lock")):
        try:
            fd = os.open(lock, os.O_RDWR)
        except OSError:  # removed by another sweep meanwhile
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: its process runs
            os.close(fd)
            continue
        _remove(lock)
        os.close(fd)
        removed.append(lock.with_suffix(""))
    return removed


def take_temp_dir(root: Path) -> Path:
    """A directory of this process's own under ``root``, made its and its children's temp dir.

    The same one at each call in a process. Sweeps ``<root>/.metricbus-tmp`` first. The lock is
    taken before the directory is made, and kept by a descriptor this process never closes; the
    directory and its lock are removed at exit, and by the next sweep after an exit that ran no
    handler.
    """
    base = Path(root) / DIR_NAME
    if base in _taken:
        return _taken[base]
    base.mkdir(parents=True, exist_ok=True)
    sweep(base)
    while True:
        fd, name = tempfile.mkstemp(suffix=".lock", dir=base)
        fcntl.flock(fd, fcntl.LOCK_EX)
        lock = Path(name)
        try:
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:
                break  # still ours: a sweep that opened it before the lock was taken lost the race
        except FileNotFoundError:
            pass  # removed by that sweep: take another
        os.close(fd)
    mine = lock.with_suffix("")
    mine.mkdir()
    tempfile.tempdir = str(mine)
    os.environ["TMPDIR"] = str(mine)
    # at exit, after the temporary directories made in it since (finalizers run newest first:
    # wandb's own would find theirs gone and say so)
    weakref.finalize(take_temp_dir, _remove, lock)
    _taken[base] = mine
    return mine
